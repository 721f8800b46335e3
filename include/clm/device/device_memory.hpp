// clm/device/device_memory.hpp: GPU memory for pools that live on the device.
//
// Implemented in lib/device/device_memory.cpp over the CUDA runtime when clmcache is
// built with CUDA; without it, or on a machine without a usable GPU, every
// call returns StatusCode::unsupported with the reason.
#pragma once

#include <cstddef>

#include "clm/status.hpp"

namespace clm {

// Number of usable CUDA devices (0 when built without CUDA or no driver/GPU);
// `reason` receives why there are none.
int cuda_device_count(std::string* reason = nullptr);

Status device_allocate(std::size_t bytes, int device, void** out);
void device_free(void* pointer, int device);

// Page-locked host memory (cudaHostAlloc, portable and mapped): unsupported
// without CUDA or a usable device.
Status pinned_host_allocate(std::size_t bytes, void** out);
void pinned_host_free(void* pointer);

}  // namespace clm
