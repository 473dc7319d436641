#pragma once
// xxHash for weight_sync: XXH3 with runtime dispatch to the widest SIMD the CPU offers (AVX2 /
// AVX-512 on x86-64); the plain library build is SSE2-only and was a large share of transfer time.
// Needs XXH_STATIC_LINKING_ONLY (set by the target) for XXH3_state_t on the stack.
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
