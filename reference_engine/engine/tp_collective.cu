// The tensor-parallel collectives (tp_collective.hpp): NCCL loaded with dlopen, and the host-staged sum.
#include "engine/tp_collective.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <barrier>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "amoeba/core/bf16.hpp"
#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {

// ---- host-staged sum

struct HostSumShared {
  explicit HostSumShared(std::uint32_t tp) : sync(tp), slots(tp), counts(tp), failed(tp) {}
  std::barrier<> sync;
  std::vector<std::vector<bf16>> slots;  // each rank's values of the current call
  std::vector<std::size_t> counts;
  std::vector<std::string> failed;  // a rank's CUDA error in the current call, empty if none
};

class HostSum final : public TpCollective {
 public:
  HostSum(std::shared_ptr<HostSumShared> shared, std::uint32_t tp, std::uint32_t rank)
      : shared_(std::move(shared)), tp_(tp), rank_(rank) {}
  std::uint32_t tp() const noexcept override { return tp_; }
  std::uint32_t rank() const noexcept override { return rank_; }
  std::string_view name() const noexcept override { return "host-sum"; }

  void all_reduce_sum_bf16(void* buf, std::size_t count, void* stream) override {
    HostSumShared& s = *shared_;
    const auto st = static_cast<cudaStream_t>(stream);
    std::vector<bf16>& mine = s.slots[rank_];
    mine.resize(count);
    s.counts[rank_] = count;
    s.failed[rank_].clear();
    cudaError_t e = cudaMemcpyAsync(mine.data(), buf, 2 * count, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) s.failed[rank_] = cudaGetErrorString(e);
    s.sync.arrive_and_wait();  // every slot written (or its failure noted): every rank decides alike below
    for (std::uint32_t r = 0; r < tp_; ++r) {
      if (!s.failed[r].empty())
        throw std::runtime_error("host-sum all-reduce: rank " + std::to_string(r) + ": " + s.failed[r]);
      if (s.counts[r] != count)
        throw std::runtime_error("host-sum all-reduce: rank " + std::to_string(r) + " sums " +
                                 std::to_string(s.counts[r]) + " values, rank " + std::to_string(rank_) +
                                 " " + std::to_string(count));
    }
    sum_.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      float acc = 0;
      for (std::uint32_t r = 0; r < tp_; ++r) acc += s.slots[r][i].to_float();
      sum_[i] = bf16::from_float(acc);  // round to nearest even
    }
    s.sync.arrive_and_wait();  // every rank has read every slot: the next call may overwrite them
    e = cudaMemcpyAsync(buf, sum_.data(), 2 * count, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);  // sum_ is reused by the next call
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("host-sum all-reduce: ") + cudaGetErrorString(e));
  }

 private:
  std::shared_ptr<HostSumShared> shared_;
  std::uint32_t tp_, rank_;
  std::vector<bf16> sum_;
};

// ---- NCCL, loaded at run time

struct NcclApi {
  void* lib = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
};

const NcclApi& nccl_api(std::size_t tp) {
  static const NcclApi api = [tp] {
    NcclApi a;
    for (const char* path : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"})
      if ((a.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (a.lib == nullptr)
      throw ConfigError("--tp", std::to_string(tp),
                        "tensor parallelism over GPUs needs NCCL: libnccl.so.2 was not found (" +
                            std::string(dlerror()) + ")");
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.lib, name));
      if (fn == nullptr)
        throw ConfigError("--tp", std::to_string(tp), std::string("libnccl.so.2 has no ") + name);
    };
    sym(a.comm_init_all, "ncclCommInitAll");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return api;
}

struct NcclShared {
  const NcclApi* api = nullptr;
  std::vector<ncclComm_t> comms;
  ~NcclShared() {
    for (ncclComm_t c : comms)
      if (c != nullptr) api->comm_destroy(c);
  }
};

class Nccl final : public TpCollective {
 public:
  Nccl(std::shared_ptr<NcclShared> shared, std::uint32_t rank) : shared_(std::move(shared)), rank_(rank) {}
  std::uint32_t tp() const noexcept override { return static_cast<std::uint32_t>(shared_->comms.size()); }
  std::uint32_t rank() const noexcept override { return rank_; }
  std::string_view name() const noexcept override { return "nccl"; }
  void all_reduce_sum_bf16(void* buf, std::size_t count, void* stream) override {
    const ncclResult_t r = shared_->api->all_reduce(buf, buf, count, ncclBfloat16, ncclSum,
                                                    shared_->comms[rank_], static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess)
      throw std::runtime_error("ncclAllReduce (rank " + std::to_string(rank_) +
                               "): " + shared_->api->error_string(r));
  }

 private:
  std::shared_ptr<NcclShared> shared_;
  std::uint32_t rank_;
};

}  // namespace

std::vector<std::shared_ptr<TpCollective>> host_sum_group(std::uint32_t tp) {
  if (tp == 0) throw ConfigError("--tp", "0", "a tensor-parallel group needs at least one rank");
  auto shared = std::make_shared<HostSumShared>(tp);
  std::vector<std::shared_ptr<TpCollective>> out;
  for (std::uint32_t r = 0; r < tp; ++r) out.push_back(std::make_shared<HostSum>(shared, tp, r));
  return out;
}

std::vector<std::shared_ptr<TpCollective>> nccl_group(const std::vector<int>& devices) {
  if (devices.empty()) throw ConfigError("--tp", "0", "a tensor-parallel group needs at least one rank");
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    throw ConfigError("--tp", std::to_string(devices.size()),
                      "NCCL needs one GPU per rank: a device is repeated (use host_sum_group on one GPU)");
  const NcclApi& api = nccl_api(devices.size());
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink SHARP off unless the user set it (the device notes)
  auto shared = std::make_shared<NcclShared>();
  shared->api = &api;
  shared->comms.assign(devices.size(), nullptr);
  const ncclResult_t r = api.comm_init_all(shared->comms.data(), int(devices.size()), devices.data());
  if (r != ncclSuccess) {
    shared->comms.assign(devices.size(), nullptr);
    throw ConfigError("--tp", std::to_string(devices.size()),
                      std::string("ncclCommInitAll failed: ") + api.error_string(r));
  }
  std::vector<std::shared_ptr<TpCollective>> out;
  for (std::uint32_t k = 0; k < devices.size(); ++k) out.push_back(std::make_shared<Nccl>(shared, k));
  return out;
}

}  // namespace amoeba::engine
