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
const DeviceInfo& device_info(int device);

}  // namespace primus_turbo
