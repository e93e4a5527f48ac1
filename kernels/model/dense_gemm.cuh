// The Qwen MoE decoders' dense projections (q/k/v/o, the router's and the shared gate's logits, the dense and
// shared expert MLPs, the LM head) as one cuBLASLt GEMM each: y[M][N] = bf16(x[M][K] · w[N][K]^T + bias[N]).
// w is row-major [N][K] as Hugging Face stores a Linear's weight; the product accumulates in float32 (split K
// partial sums too) and the bias is added in the epilogue before the one rounding to bf16, as the host
// reference's `linear` does (reference_engine/engine/decoder_reference.cpp, which accumulates in double:
// results agree within one bf16 ulp except where cancellation leaves a result far smaller than its terms).
//
// No allocation on the device: the caller passes the workspace (kWorkspaceBytes, the size NVIDIA recommends
// for Hopper). The handle is created once; cublasLtMatmulAlgoGetHeuristic runs once per (plan_rows(M), N, K,
// bias) and its answer is cached with the descriptors, so a step only looks the shape up and launches. The
// query is host work the GPU waits for when it falls in a step (steps of a size the engine had not had
// before are the slow ones on the H200: docs/results/calibration_h200.md), so rows above kExactRows share one
// algorithm per bucket (plan_rows); prepare() builds every bucket's plan of a projection up to a largest M
// without launching, and a run at every M (the CUDA backend's warm-up at setup) also meets the Ms a bucket's
// algorithm cannot serve, which query once for themselves (exact_fallbacks()).
// cuBLASLt's first heuristic choice is not always its fastest at decode-sized M (the router's N = 61 at M =
// 7-10 took 1.3x the best of its first 8 on the H200: docs/results/dense_gemm_h200.md): tune() times the
// first candidates and keeps the fastest; tune_once() does it once per shape and device for the whole process
// (the CUDA backend's warm-up calls it for every projection at M <= kExactRows). A DenseGemm is not thread
// safe and its workspace serves one stream: use one per stream (tune_once's record of choices is shared and
// locked).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "moe/moe_shape.hpp"

namespace amoeba::kernels::decoder {

using bf16 = __nv_bfloat16;

class DenseGemm {
 public:
  // NVIDIA's recommended cuBLASLt workspace for Hopper (the cublasSetWorkspace notes).
  static constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;
  // One plan per (plan_rows(M), projection shape), plus one per M whose bucket's algorithm could not serve it
  // (an exact fallback): a few thousand for an engine that prepares and warms every M up to its token budget.
  // Past this bound the cache is cleared and refills on the next calls (a miss costs a heuristic query on the
  // host, no device work).
  static constexpr std::size_t kMaxCachedPlans = std::size_t(1) << 15;

  // The rows an algorithm is chosen for: M itself up to kExactRows (decode batches), above it M rounded up
  // to a multiple of 1/8 of the power of two below it (eight buckets per octave, at most 12.5% above M).
  // cuBLASLt's algorithm for those rows serves every M of the bucket (cublasLtMatmul rejects an algorithm
  // that cannot serve a size; run() then queries for M itself).
  static constexpr int kExactRows = 64;
  static constexpr int plan_rows(int M) {
    if (M <= kExactRows) return M;
    int p = kExactRows;
    while (p <= M / 2) p *= 2;  // the largest power of two <= M
    const int step = p / 8;
    return (M + step - 1) / step * step;
  }

  // `workspace`: device memory, 256-byte aligned (cudaMalloc's is), `workspace_bytes` of it (0 allowed: fewer
  // algorithms); it must outlive this object. Errors (handle creation) are kept and returned by run().
  DenseGemm(void* workspace, std::size_t workspace_bytes)
      : workspace_(workspace), workspace_bytes_(workspace_bytes) {
    if (workspace_bytes > 0 && workspace == nullptr) {
      ready_ = Status::error("workspace", "must not be null when workspace_bytes > 0");
      return;
    }
    if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
      ready_ = Status::error("workspace", "must be 256-byte aligned");
      return;
    }
    if (cudaGetDevice(&device_) != cudaSuccess) {
      ready_ = Status::error("cudaGetDevice", cudaGetErrorString(cudaGetLastError()));
      return;
    }
    ready_ = check(cublasLtCreate(&handle_), "cublasLtCreate");
    if (ready_) ready_ = init_preference();
  }
  ~DenseGemm() {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // Success, or why the constructor failed.
  const Status& status() const { return ready_; }

  // The argument rules of run(), checked without touching the device: M >= 0; K, N > 0; K a multiple of 8
  // (16-byte rows of x and w); with M > 0, x, w and y non-null and, like bias when given, 16-byte aligned.
  // N need not be a multiple of 8 without a bias: the router (60 or 128 experts) and the shared gate (N = 1)
  // are GEMMs too; with a bias it must be (see below).
  static Status can_implement(const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias,
                              const bf16* y) {
    if (M < 0) return Status::error("M", M, "must be >= 0");
    if (K <= 0) return Status::error("K", K, "must be > 0");
    if (N <= 0) return Status::error("N", N, "must be > 0");
    if (K % 8 != 0) return Status::error("K", K, "must be a multiple of 8 (16-byte rows of x and w)");
    if (M == 0) return Status::success();
    if (x == nullptr) return Status::error("x", "must not be null");
    if (w == nullptr) return Status::error("w", "must not be null");
    if (y == nullptr) return Status::error("y", "must not be null");
    if (!aligned16(x)) return Status::error("x", "must be 16-byte aligned");
    if (!aligned16(w)) return Status::error("w", "must be 16-byte aligned");
    if (!aligned16(y)) return Status::error("y", "must be 16-byte aligned");
    if (bias != nullptr && !aligned16(bias)) return Status::error("bias", "must be 16-byte aligned");
    // Measured on the H200 (cuBLASLt of CUDA 13.0): with the bias epilogue and N = 60, one result was 2 bf16
    // ulps off (beyond what cancellation explains); every N that is a multiple of 8 was within one ulp.
    // Biases exist only on q/k/v projections (N = heads x head_dim), so the rule costs nothing.
    if (bias != nullptr && N % 8 != 0)
      return Status::error("N", N, "must be a multiple of 8 when a bias is given");
    return Status::success();
  }

  // y[M][N] = bf16(x[M][K] · w[N][K]^T + bias[N]), bias optional (null: none); enqueued on `stream`. M = 0
  // does nothing. Errors: a broken rule of can_implement, or the cuBLASLt call that failed and its status.
  Status run(const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias, bf16* y,
             cudaStream_t stream) {
    if (Status st = can_implement(x, M, K, w, N, bias, y); !st) return st;
    if (M == 0) return Status::success();
    if (!ready_) return ready_;
    Plan* plan = nullptr;
    if (Status st = find_plan(Key{plan_rows(M), N, K, bias != nullptr}, bias, plan); !st) return st;
    cublasStatus_t s = matmul(*plan, x, M, K, w, N, bias, y, stream);
    if ((s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) && plan->rows != M) {
      // The bucket's algorithm cannot serve M: one chosen for M itself (cached under -M).
      if (Status st = find_plan(Key{-M, N, K, bias != nullptr}, bias, plan); !st) return st;
      ++exact_fallbacks_;
      s = matmul(*plan, x, M, K, w, N, bias, y, stream);
    }
    return check(s, "cublasLtMatmul");
  }

  // Builds, without launching anything, every plan that run() needs for M = 1 .. max_M with this (N, K,
  // bias): run() then never queries the heuristic for these shapes. `bias` is only looked at for null and
  // its alignment (the heuristic's view); the argument rules are run()'s.
  Status prepare(int max_M, int N, int K, const bf16* bias) {
    if (max_M < 1) return Status::error("max_M", max_M, "must be >= 1");
    if (!ready_) return ready_;
    for (const int rows : bucket_rows(max_M)) {
      Plan* plan = nullptr;
      if (Status st = find_plan(Key{rows, N, K, bias != nullptr}, bias, plan); !st) return st;
    }
    return Status::success();
  }

  // Times the first `candidates` algorithms of cuBLASLt's heuristic for M's plan on these operands (one
  // warm-up launch, then `reps` launches each between two CUDA events on `stream`; the median) and makes the
  // fastest the plan's, so that run() at M uses it from then on (cuBLASLt's first choice is not always its
  // fastest for decode-sized M). M must be a bucket's row count (plan_rows(M) == M: every M <= kExactRows);
  // x and y hold M rows. Writes y, synchronises `stream`. `timings`, when given, receives each candidate's
  // median in µs in the heuristic's order (infinity where cuBLASLt refused it); `chosen` its index. Errors:
  // run()'s rules, M not a bucket's, candidates or reps < 1, or every candidate refused.
  Status tune(const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias, bf16* y,
              cudaStream_t stream, int candidates = 8, int reps = 20, std::vector<float>* timings = nullptr,
              int* chosen = nullptr) {
    if (Status st = tunable(x, M, K, w, N, bias, y); !st) return st;
    if (candidates < 1) return Status::error("candidates", candidates, "must be >= 1");
    if (reps < 1) return Status::error("reps", reps, "must be >= 1");
    if (!ready_) return ready_;
    Plan* plan = nullptr;
    if (Status st = find_plan(Key{M, N, K, bias != nullptr}, bias, plan); !st) return st;
    // (Not a std::vector: nvcc 13.0's front end fails an internal assertion on one of this struct in C++20.)
    const auto results =
        std::make_unique<cublasLtMatmulHeuristicResult_t[]>(static_cast<std::size_t>(candidates));
    int found = 0;
    if (Status st = check(cublasLtMatmulAlgoGetHeuristic(handle_, &plan->desc, &plan->a, &plan->b, &plan->d,
                                                         &plan->d, &pref_, candidates, results.get(), &found),
                          "cublasLtMatmulAlgoGetHeuristic");
        !st)
      return st;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    for (cudaEvent_t& e : ev)
      if (cudaEventCreate(&e) != cudaSuccess) {
        for (cudaEvent_t d : ev)
          if (d != nullptr) cudaEventDestroy(d);
        return Status::error("cudaEventCreate", "failed");
      }
    const cublasLtMatmulAlgo_t first = plan->algo;
    std::vector<float> us(static_cast<std::size_t>(found), std::numeric_limits<float>::infinity());
    std::vector<float> samples(static_cast<std::size_t>(reps));
    Status timing = Status::success();
    int best = -1;
    for (int i = 0; i < found && timing.ok; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      plan->algo = results[i].algo;
      if (matmul(*plan, x, M, K, w, N, bias, y, stream) != CUBLAS_STATUS_SUCCESS) continue;  // refused
      for (int r = 0; r < reps && timing.ok; ++r) {
        if (cudaEventRecord(ev[0], stream) != cudaSuccess ||
            matmul(*plan, x, M, K, w, N, bias, y, stream) != CUBLAS_STATUS_SUCCESS ||
            cudaEventRecord(ev[1], stream) != cudaSuccess || cudaEventSynchronize(ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&samples[r], ev[0], ev[1]) != cudaSuccess)
          timing = Status::error(
              "tune", "a timed launch failed: " + std::string(cudaGetErrorString(cudaGetLastError())));
      }
      if (!timing.ok) break;
      std::nth_element(samples.begin(), samples.begin() + reps / 2, samples.end());
      us[i] = 1000.0f * samples[reps / 2];
      if (best < 0 || us[i] < us[best]) best = i;
    }
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    plan->algo = best >= 0 && timing.ok ? results[best].algo : first;
    if (!timing.ok) return timing;
    if (best < 0)
      return Status::error("tune", "cuBLASLt refused every one of " + std::to_string(found) + " algorithms");
    if (timings != nullptr) *timings = us;
    if (chosen != nullptr) *chosen = best;
    return Status::success();
  }

  // tune() once per process and shape: the first tune_once() of a (device, M, N, K, bias or not, workspace
  // bytes) in the process times the candidates as tune() does and records the fastest; every later
  // tune_once() of that key, by any DenseGemm of the process, adopts the recorded algorithm without timing,
  // and so does a plan of it rebuilt after the plan cache was cleared. Two engines of one process therefore
  // compute a projection alike whatever the timing noise (tests compare their tokens bit for bit); two
  // processes may choose differently (a projection then rounds differently, within one bf16 ulp of the exact
  // product either way). `chosen` receives the recorded algorithm's position in the heuristic's list,
  // `timed` whether this call measured. Errors: tune()'s.
  Status tune_once(const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias, bf16* y,
                   cudaStream_t stream, int candidates = 8, int reps = 5, int* chosen = nullptr,
                   bool* timed = nullptr) {
    if (timed != nullptr) *timed = false;
    if (Status st = tunable(x, M, K, w, N, bias, y); !st) return st;
    if (!ready_) return ready_;
    const TunedKey key = tuned_key(M, N, K, bias != nullptr);
    Plan* plan = nullptr;
    if (Status st = find_plan(Key{M, N, K, bias != nullptr}, bias, plan); !st) return st;
    if (const std::optional<Tuned> t = recorded(key)) {
      plan->algo = t->algo;  // (a plan built before the record)
      if (chosen != nullptr) *chosen = t->index;
      return Status::success();
    }
    int best = -1;
    if (Status st = tune(x, M, K, w, N, bias, y, stream, candidates, reps, nullptr, &best); !st) return st;
    if (timed != nullptr) *timed = true;
    // Another thread may have recorded the key meanwhile: the first record wins, everyone adopts it.
    const Tuned t = record(key, Tuned{plan->algo, best});
    plan->algo = t.algo;
    if (chosen != nullptr) *chosen = t.index;
    return Status::success();
  }

  // The distinct plan_rows() values of M = 1 .. max_M, ascending: the row counts prepare() plans for.
  static std::vector<int> bucket_rows(int max_M) {
    std::vector<int> rows;
    for (int M = 1; M <= max_M; M = plan_rows(M) + 1) rows.push_back(plan_rows(M));
    return rows;
  }

  // How many plans are cached (one per (plan_rows(M), N, K, bias) seen), and how often a bucket's algorithm
  // could not serve an M (run() then used one chosen for M).
  std::size_t cached_plans() const { return plans_.size(); }
  std::uint64_t exact_fallbacks() const { return exact_fallbacks_; }

 private:
  // cuBLASLt is column-major: the row-major y[M][N] is D = N×M (ld N), w[N][K] is A = K×N (ld K) transposed,
  // x[M][K] is B = K×M (ld K). The descriptors live in the map's nodes, which never move.
  struct Plan {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t a, b, d;  // b and d for `rows` rows
    cublasLtMatmulAlgo_t algo;
    int rows = 0;
  };
  struct Key {
    int m, n, k;  // m: plan_rows(M), or -M for an algorithm chosen for M itself
    bool bias;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const {
      std::size_t h = std::hash<int>{}(key.m);
      for (int v : {key.n, key.k, int(key.bias)}) h = h * 1000003u ^ std::hash<int>{}(v);
      return h;
    }
  };

  // The process's tune_once() choices (one map for every DenseGemm; a mutex because a tensor-parallel
  // group's ranks set up from their own threads).
  struct TunedKey {
    int device, m, n, k;
    bool bias;
    std::size_t workspace_bytes;
    auto operator<=>(const TunedKey&) const = default;
  };
  struct Tuned {
    cublasLtMatmulAlgo_t algo;
    int index;  // in the heuristic's list when it was timed
  };
  static std::mutex& tuned_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<TunedKey, Tuned>& tuned_choices() {
    static std::map<TunedKey, Tuned> choices;
    return choices;
  }
  TunedKey tuned_key(int m, int n, int k, bool bias) const {
    return TunedKey{device_, m, n, k, bias, workspace_bytes_};
  }
  static std::optional<Tuned> recorded(const TunedKey& key) {
    const std::lock_guard<std::mutex> lock(tuned_mutex());
    const auto it = tuned_choices().find(key);
    if (it == tuned_choices().end()) return std::nullopt;
    return it->second;
  }
  static Tuned record(const TunedKey& key, const Tuned& t) {
    const std::lock_guard<std::mutex> lock(tuned_mutex());
    return tuned_choices().try_emplace(key, t).first->second;
  }

  // tune()'s and tune_once()'s argument rules: run()'s, and M a bucket's row count.
  static Status tunable(const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias, const bf16* y) {
    if (Status st = can_implement(x, M, K, w, N, bias, y); !st) return st;
    if (M == 0 || plan_rows(M) != M)
      return Status::error("M", M, "must be a bucket's row count (plan_rows(M) == M, M > 0)");
    return Status::success();
  }

  static bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

  static Status check(cublasStatus_t s, const char* call) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::success();
    return Status::error(call,
                         std::string(cublasLtGetStatusName(s)) + " (" + cublasLtGetStatusString(s) + ")");
  }

  Status init_preference() {
    if (Status st = check(cublasLtMatmulPreferenceInit(&pref_), "cublasLtMatmulPreferenceInit"); !st)
      return st;
    const std::uint64_t bytes = workspace_bytes_;
    if (Status st = check(cublasLtMatmulPreferenceSetAttribute(
                              &pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)),
                          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
        !st)
      return st;
    // One rounding to bf16: a split K dot product may be reduced in float32 (COMPUTE_TYPE) but not through
    // bf16 partial results (INPLACE and OUTPUT_TYPE reduce in the output's type).
    const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (Status st =
            check(cublasLtMatmulPreferenceSetAttribute(&pref_, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                       &reduction, sizeof(reduction)),
                  "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
        !st)
      return st;
    // The default assumes 256-byte aligned matrices; run() promises 16 (rows of a matrix are not 256 apart).
    const std::uint32_t align = 16;
    for (cublasLtMatmulPreferenceAttributes_t attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (Status st = check(cublasLtMatmulPreferenceSetAttribute(&pref_, attr, &align, sizeof(align)),
                            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
          !st)
        return st;
    return Status::success();
  }

  // y = x w^T (+ bias) with `plan`'s algorithm; the layouts of x and y are the plan's when M is its rows,
  // else made here for M (host only: no query).
  cublasStatus_t matmul(Plan& plan, const bf16* x, int M, int K, const bf16* w, int N, const bf16* bias,
                        bf16* y, cudaStream_t stream) {
    if (bias != nullptr) {
      const cublasStatus_t s =
          cublasLtMatmulDescSetAttribute(&plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
      if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    cublasLtMatrixLayoutOpaque_t b_m, d_m;
    cublasLtMatrixLayoutOpaque_t *b = &plan.b, *d = &plan.d;
    if (M != plan.rows) {
      cublasStatus_t s = cublasLtMatrixLayoutInit(&b_m, CUDA_R_16BF, std::uint64_t(K), std::uint64_t(M), K);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutInit(&d_m, CUDA_R_16BF, std::uint64_t(N), std::uint64_t(M), N);
      if (s != CUBLAS_STATUS_SUCCESS) return s;
      b = &b_m, d = &d_m;
    }
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(handle_, &plan.desc, &one, w, &plan.a, x, b, &zero, y, d, y, d, &plan.algo,
                          workspace_, workspace_bytes_, stream);
  }

  // The cached plan of `key`, built on a miss in its map node (cuBLASLt's descriptors are built in place,
  // never copied). The heuristic sees the first call's bias pointer (it reads the pointer's alignment, not
  // the data); every bias is 16-byte aligned, which the bias epilogue needs.
  Status find_plan(const Key& key, const bf16* bias, Plan*& out) {
    if (auto it = plans_.find(key); it != plans_.end()) {
      out = &it->second;
      return Status::success();
    }
    if (plans_.size() >= kMaxCachedPlans) plans_.clear();
    const auto it = plans_.try_emplace(key).first;
    if (Status st = build_plan(key.m < 0 ? -key.m : key.m, key.n, key.k, bias, it->second); !st) {
      plans_.erase(it);
      return st;
    }
    out = &it->second;
    return Status::success();
  }

  Status build_plan(int M, int N, int K, const bf16* bias, Plan& p) {
    if (Status st =
            check(cublasLtMatmulDescInit(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
        !st)
      return st;
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const std::int32_t bias_type = CUDA_R_16BF;
    auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, std::size_t bytes) {
      return check(cublasLtMatmulDescSetAttribute(&p.desc, attr, value, bytes),
                   "cublasLtMatmulDescSetAttribute");
    };
    if (Status st = set(CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)); !st) return st;
    if (Status st = set(CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)); !st) return st;
    if (Status st = set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)); !st) return st;
    if (bias != nullptr) {
      if (Status st = set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)); !st) return st;
      if (Status st = set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)); !st) return st;
    }
    auto layout = [](cublasLtMatrixLayoutOpaque_t& l, int rows, int cols, int ld) {
      return check(cublasLtMatrixLayoutInit(&l, CUDA_R_16BF, std::uint64_t(rows), std::uint64_t(cols), ld),
                   "cublasLtMatrixLayoutInit");
    };
    if (Status st = layout(p.a, K, N, K); !st) return st;
    if (Status st = layout(p.b, K, M, K); !st) return st;
    if (Status st = layout(p.d, N, M, N); !st) return st;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (Status st = check(cublasLtMatmulAlgoGetHeuristic(handle_, &p.desc, &p.a, &p.b, &p.d, &p.d, &pref_, 1,
                                                         &result, &found),
                          "cublasLtMatmulAlgoGetHeuristic");
        !st)
      return st;
    if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
      return Status::error("cublasLtMatmulAlgoGetHeuristic",
                           "no algorithm for M = " + std::to_string(M) + ", N = " + std::to_string(N) +
                               ", K = " + std::to_string(K) + (bias != nullptr ? " with bias" : ""));
    p.algo = result.algo;
    p.rows = M;
    // A bucket's plan of a shape tune_once() chose for in this process takes that choice.
    if (M <= kExactRows)
      if (const std::optional<Tuned> t = recorded(tuned_key(M, N, K, bias != nullptr))) p.algo = t->algo;
    return Status::success();
  }

  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int device_ = 0;  // current at construction: the device the handle and the plans serve
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulPreferenceOpaque_t pref_{};
  Status ready_;
  std::unordered_map<Key, Plan, KeyHash> plans_;
  std::uint64_t exact_fallbacks_ = 0;
};

}  // namespace amoeba::kernels::decoder
