// FlashInfer's chain speculative sampling kernel, compiled from the header that the flashinfer-python wheel ships
// (data/include/flashinfer/sampling.cuh), behind one C entry point that ctypes can call. Built by
// scripts/build_flashinfer_chain.sh where nvcc is; used by bench/flashinfer_peer.py where the flashinfer package
// itself cannot be imported (0.7's top-level import needs cutlass-dsl, cuda-tile and nccl4py).
#include <flashinfer/sampling.cuh>

// draft_probs [B, n, V] fp32, draft_ids [B, n] int32, target_probs [B, n+1, V] fp32 -> out [B, n+1] int32 (−1 padded);
// accepted, emitted [B] int32, added to (zero them first). Returns the cudaError_t of the launch.
extern "C" int specdec_flashinfer_chain(float* draft_probs, int* draft_ids, float* target_probs, int* out,
                                        int* accepted, int* emitted, unsigned batch, unsigned n, unsigned vocab,
                                        unsigned long long seed, unsigned long long offset, void* stream) {
  return static_cast<int>(flashinfer::sampling::ChainSpeculativeSampling<float, int>(
      draft_probs, draft_ids, target_probs, out, accepted, emitted, batch, n, vocab, /*deterministic=*/true,
      nullptr, seed, nullptr, offset, static_cast<cudaStream_t>(stream)));
}
