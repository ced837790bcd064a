#include "runtime/device.h"

#include <map>
#include <mutex>

#include "core/cuda_check.h"

namespace primus_turbo {

int current_device() {
  int dev = 0;
  PT_CHECK_CUDA(cudaGetDevice(&dev));
  return dev;
}

void bind_device_context(int device) {
  thread_local int bound = -1;
  if (bound == device) return;
  // Since CUDA 12, cudaSetDevice initializes the primary context and makes it current.
  PT_CHECK_CUDA(cudaSetDevice(device));
  bound = device;
}

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  cudaDeviceProp prop;
  PT_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.index = device;
  info.sm_count = prop.multiProcessorCount;
  info.major = prop.major;
  info.minor = prop.minor;
  info.name = prop.name;
  return cache.emplace(device, info).first->second;
}

std::string arch_for_device(int device) {
  const DeviceInfo& info = device_info(device);
  if (info.major == 9 && info.minor == 0) return "90a";
  return str_cat(info.major, info.minor);
}

}  // namespace primus_turbo
