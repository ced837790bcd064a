// Facts about the current CUDA device, queried once per device.
#pragma once

#include <string>

namespace primus_turbo {

struct DeviceInfo {
  int index = 0;
  int sm_count = 0;
  int major = 0;
  int minor = 0;
  std::string name;
};

int current_device();
// Binds the device's primary context to the calling thread (once per thread and device). A thread
// that only ever asked for device 0 may have no context bound (e.g. an autograd worker), and the
// driver API calls kernels make on the host, such as encoding TMA descriptors, then fail.
void bind_device_context(int device);
const DeviceInfo& device_info(int device);

// The nvcc arch JIT kernels are built for on a device (sm_90a on Hopper, the plain compute
// capability elsewhere).
std::string arch_for_device(int device);

}  // namespace primus_turbo
