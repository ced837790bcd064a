// Hopper's bulk-copy engine (cp.async.bulk, the 1-D form of TMA) into shared memory, completed on
// an mbarrier that counts the bytes: one thread issues a copy of a contiguous range, every thread
// waits for the phase. For kernels that keep many loads in flight without registers to hold them.
// Sizes and addresses are multiples of 16 bytes.
#pragma once

#include <cstdint>

namespace primus_turbo::kernels::bulk {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One arrival (the issuing thread's expect_tx) completes a phase, with the bytes it announced.
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
}

// Makes the initialized barriers visible to the copy engine (then a block barrier for the threads).
__device__ __forceinline__ void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// The issuing thread: the phase completes when `bytes` more have arrived.
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Copies `bytes` from global src to shared dst, counted on bar.
__device__ __forceinline__ void load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// Waits until the phase of the given parity (0, 1, 0, ... for the barrier's uses) has completed.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

}  // namespace primus_turbo::kernels::bulk
