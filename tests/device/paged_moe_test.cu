// Device tests of PagedMoe: paged and contiguous addressing, decode and grouped paths, against the double CPU
// reference (small token counts) and the fp32 GPU reference (sampled tokens), on random data with poisoned
// outputs, experts on shuffled pool pages and in a load buffer.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "moe/paged_moe.cuh"
#include "moe_device_fixture.cuh"
#include "reference/moe_reference.hpp"
#include "reference/moe_reference_kernel.cuh"

namespace {

using namespace amoeba;
using namespace amoeba::testing;
using kernels::MoePath;
using kernels::PagedMoe;
using reference::bf16_to_float;

template <class Addressing>
struct Runner {
  typename PagedMoe<Addressing>::Arguments args{};
  DeviceBuffer<unsigned char> workspace;
  DeviceBuffer<bf16> out;

  std::vector<std::uint16_t> run(const RoutingSet& r, const MoeShape& shape, typename Addressing::Arguments w,
                                 MoePath path, bool with_shared_weights) {
    args.shape = shape;
    args.input = r.x.get();
    args.topk_ids = r.ids.get();
    args.topk_weights = r.weights.get();
    args.shared_weights = with_shared_weights ? r.shared.get() : nullptr;
    args.weights = w;
    args.path = path;
    out = DeviceBuffer<bf16>(static_cast<std::size_t>(shape.num_tokens) * shape.hidden);
    args.output = out.get();
    const kernels::Status ok = PagedMoe<Addressing>::can_implement(args);
    INFO(ok.message);
    REQUIRE(ok.ok);
    const std::size_t bytes = PagedMoe<Addressing>::workspace_size(args);
    workspace = DeviceBuffer<unsigned char>(bytes);
    poison(out.get(), out.size());
    // Poison the workspace too: nothing may read scratch that this call did not write.
    AMOEBA_CUDA_CHECK(cudaMemset(workspace.get(), 0xFF, bytes));
    const kernels::Status st = PagedMoe<Addressing>{}.run(args, workspace.get(), bytes, nullptr);
    INFO(st.message);
    REQUIRE(st.ok);
    AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint16_t> h(out.size());
    AMOEBA_CUDA_CHECK(cudaMemcpy(h.data(), out.get(), h.size() * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

std::size_t count_nonfinite(const std::vector<std::uint16_t>& v) {
  std::size_t n = 0;
  for (std::uint16_t b : v) n += !std::isfinite(bf16_to_float(b));
  return n;
}

// Double CPU reference over all tokens.
std::vector<double> cpu_reference(ExpertStore& store, const RoutingSet& r, const MoeShape& shape,
                                  bool with_shared_weights) {
  std::vector<std::uint16_t> x(static_cast<std::size_t>(shape.num_tokens) * shape.hidden);
  AMOEBA_CUDA_CHECK(cudaMemcpy(x.data(), r.x.get(), x.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<reference::ExpertMatrices> experts(shape.total_experts());
  std::vector<char> needed(shape.total_experts(), 0);
  for (int id : r.ids_host) needed[id] = 1;
  for (int e = shape.num_experts; e < shape.total_experts(); ++e) needed[e] = 1;
  static const std::uint16_t dummy[1] = {0};
  for (int e = 0; e < shape.total_experts(); ++e) {
    if (!needed[e]) {
      experts[e] = {dummy, dummy, dummy};
      continue;
    }
    const auto& m = store.host_expert(e);
    const std::size_t me = store.matrix_elems();
    experts[e] = {m.data(), m.data() + me, m.data() + 2 * me};
  }
  reference::MoeReferenceInputs in{
      shape,
      x,
      r.ids_host,
      r.weights_host,
      with_shared_weights ? std::span<const float>(r.shared_host) : std::span<const float>(),
      experts};
  REQUIRE(reference::check(in).ok);
  std::vector<double> out(x.size());
  reference::moe_reference(in, out);
  return out;
}

// fp32 GPU reference over sampled tokens; returns {sampled token ids, [n, H] values}.
std::pair<std::vector<int>, std::vector<float>> gpu_reference(const ExpertStore& store, const RoutingSet& r,
                                                              const MoeShape& shape, bool with_shared_weights,
                                                              int max_samples) {
  std::vector<int> tokens;
  const int n = std::min(shape.num_tokens, max_samples);
  for (int i = 0; i < n; ++i)
    tokens.push_back(
        static_cast<int>(static_cast<long long>(i) * (shape.num_tokens - 1) / std::max(1, n - 1)));
  DeviceBuffer<int> d_tokens(tokens.size());
  d_tokens.upload(tokens);
  DeviceBuffer<float> act(static_cast<std::size_t>(n) * shape.slots_per_token() * shape.intermediate);
  DeviceBuffer<float> out(static_cast<std::size_t>(n) * shape.hidden);
  reference::GpuReferenceParams p{store.reference_table(),
                                  r.x.get(),
                                  r.ids.get(),
                                  r.weights.get(),
                                  with_shared_weights ? r.shared.get() : nullptr,
                                  d_tokens.get(),
                                  n,
                                  shape.hidden,
                                  shape.intermediate,
                                  shape.num_experts,
                                  shape.top_k,
                                  shape.slots_per_token(),
                                  act.get(),
                                  out.get()};
  AMOEBA_CUDA_CHECK(reference::run_reference(p, nullptr));
  AMOEBA_CUDA_CHECK(cudaDeviceSynchronize());
  return {tokens, out.download()};
}

double rel_error_rows(const std::vector<std::uint16_t>& out, const std::vector<int>& tokens,
                      const std::vector<float>& ref, int hidden) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int h = 0; h < hidden; ++h) {
      const double a = bf16_to_float(out[static_cast<std::size_t>(tokens[i]) * hidden + h]);
      const double b = ref[i * hidden + h];
      num += (a - b) * (a - b);
      den += b * b;
    }
  return std::sqrt(num / den);
}

double rel_error_all(const std::vector<std::uint16_t>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double a = bf16_to_float(out[i]);
    num += (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

const char* path_name(MoePath p) {
  return p == MoePath::kDecode       ? "decode"
         : p == MoePath::kGrouped    ? "grouped"
         : p == MoePath::kGroupedMma ? "mma"
                                     : "auto";
}

// Runs one case on both addressings and checks everything; returns the paged output.
void check_case(ExpertStore& store, const MoeShape& shape, MoePath path, bool cpu_check, int gpu_samples,
                std::uint64_t seed) {
  const bool with_shared_weights = shape.num_shared_chunks > 0;
  RoutingSet r = make_routing(store.spec(), shape.num_tokens, seed);
  Runner<kernels::Paged> paged;
  Runner<kernels::Contiguous> contiguous;
  const auto out_p = paged.run(r, shape, store.paged_args(), path, with_shared_weights);
  const auto out_c = contiguous.run(r, shape, store.contiguous_args(), path, with_shared_weights);
  const MoePath chosen = PagedMoe<kernels::Paged>::chosen_path(paged.args);
  INFO(store.spec().name << " T=" << shape.num_tokens << " path=" << path_name(chosen)
                         << " tile=" << PagedMoe<kernels::Paged>::tile_tokens(paged.args));
  CHECK(count_nonfinite(out_p) == 0);
  CHECK(count_nonfinite(out_c) == 0);
  // Same instructions on the same values: paged and contiguous agree bit for bit.
  CHECK(std::memcmp(out_p.data(), out_c.data(), out_p.size() * 2) == 0);
  const auto [tokens, gref] = gpu_reference(store, r, shape, with_shared_weights, gpu_samples);
  const double err_gpu = rel_error_rows(out_p, tokens, gref, shape.hidden);
  double err_cpu = -1;
  if (cpu_check) {
    const auto cref = cpu_reference(store, r, shape, with_shared_weights);
    err_cpu = rel_error_all(out_p, cref);
    // The fp32 GPU reference itself agrees with the double one far below bf16 rounding.
    std::vector<double> sampled;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      for (int h = 0; h < shape.hidden; ++h)
        sampled.push_back(cref[static_cast<std::size_t>(tokens[i]) * shape.hidden + h]);
    CHECK(reference::relative_l2_error(gref, sampled) < 1e-4);
    CHECK(err_cpu <= 1e-2);
  }
  std::printf("  %-20s T=%-6d path=%-8s tile=%-4d rel_err gpu_ref=%.3e cpu_ref=%.3e\n", store.spec().name,
              shape.num_tokens, path_name(chosen), PagedMoe<kernels::Paged>::tile_tokens(paged.args), err_gpu,
              err_cpu);
  CHECK(err_gpu <= 1e-2);
}

}  // namespace

TEST_CASE("small shapes against the CPU reference, both paths and addressings", "[gpu][small]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  const ModelSpec tiny_routed{"tiny", 8, 2, 256, 128, 0};
  for (const ModelSpec& spec : {tiny, tiny_routed}) {
    ExpertStore store(spec, 7, 3);
    for (int tokens : {1, 5, 37, 300})
      for (MoePath path : {MoePath::kDecode, MoePath::kGrouped, MoePath::kGroupedMma})
        check_case(store, shape_of(spec, tokens), path, true, 64, 100 + tokens);
  }
}

TEST_CASE("model shapes at every token count", "[gpu][models]") {
  struct Case {
    ModelSpec spec;
    int cpu_max_tokens;
  };
  for (const Case& c : {Case{kQwen15, 16}, Case{kQwen3, 16}, Case{kMixtral, 3}}) {
    ExpertStore store(c.spec, 11);
    std::printf("%s: %d of %d experts in the load buffer\n", c.spec.name, store.num_buffered(),
                shape_of(c.spec, 0).total_experts());
    for (int tokens : {1, 3, 16, 33, 64, 256, 1024, 4096, 16384}) {
      const MoeShape shape = shape_of(c.spec, tokens);
      check_case(store, shape, MoePath::kAuto, tokens <= c.cpu_max_tokens, 48, 1000 + tokens);
      if (tokens == 33 || tokens == 1024) {  // the other paths too, where they are plausible
        check_case(store, shape, tokens == 33 ? MoePath::kGrouped : MoePath::kDecode, false, 48,
                   2000 + tokens);
        check_case(store, shape, MoePath::kGroupedMma, false, 48, 3000 + tokens);
      }
    }
  }
}

TEST_CASE("ids outside [0, E) contribute nothing, zero tokens is a no-op", "[gpu][small]") {
  const ModelSpec spec{"tiny", 8, 2, 256, 128, 0};
  ExpertStore store(spec, 3, 0);
  RoutingSet r = make_routing(spec, 9, 5);
  Runner<kernels::Contiguous> run;
  const MoeShape shape = shape_of(spec, 9);
  const auto full = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  // Drop slot 1 of every token by marking it -1 (and 99): the result equals slot 0 alone with its weight.
  std::vector<std::int32_t> ids = r.ids_host;
  for (int t = 0; t < 9; ++t) ids[2 * t + 1] = (t % 2) ? -1 : 99;
  r.ids.upload(ids);
  const auto dropped = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  std::vector<std::int32_t> single = ids;
  std::vector<float> w = r.weights_host;
  for (int t = 0; t < 9; ++t) single[2 * t + 1] = single[2 * t], w[2 * t + 1] = 0.f;
  r.ids.upload(single);
  r.weights.upload(w);
  const auto ref = run.run(r, shape, store.contiguous_args(), MoePath::kAuto, false);
  CHECK(std::memcmp(dropped.data(), ref.data(), ref.size() * 2) == 0);
  CHECK(std::memcmp(dropped.data(), full.data(), full.size() * 2) != 0);

  PagedMoe<kernels::Contiguous>::Arguments empty{};
  empty.shape = shape_of(spec, 0);
  empty.weights = store.contiguous_args();
  REQUIRE(PagedMoe<kernels::Contiguous>::can_implement(empty).ok);
  CHECK(PagedMoe<kernels::Contiguous>{}.run(empty, nullptr, 0, nullptr).ok);
}

TEST_CASE("can_implement names the field, the value and the rule", "[gpu][small]") {
  PagedMoe<kernels::Paged>::Arguments a{};
  a.shape = MoeShape{4, 2048, 1400, 60, 4, 0};
  kernels::Status s = PagedMoe<kernels::Paged>::can_implement(a);
  CHECK_FALSE(s.ok);
  CHECK(s.field == "shape.intermediate");
  CHECK(s.message.find("1400") != std::string::npos);
  a.shape.intermediate = 1408;
  s = PagedMoe<kernels::Paged>::can_implement(a);
  CHECK(s.field == "input");
  a.shape.top_k = 61;
  CHECK(PagedMoe<kernels::Paged>::can_implement(a).field == "top_k");
  a.shape = MoeShape{0, 2048, 1408, 60, 4, 0};
  CHECK(PagedMoe<kernels::Paged>::can_implement(a).field == "weights.pool_base");
}

// Small enough for compute-sanitizer (memcheck, racecheck): both paths, both routing paths (S <= 8192 and
// not).
TEST_CASE("sanitizer case: both GEMM paths and both routing paths", "[gpu][sanitize]") {
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  ExpertStore store(tiny, 5, 3);
  for (int tokens : {5, 3000})
    for (MoePath path : {MoePath::kDecode, MoePath::kGrouped, MoePath::kGroupedMma})
      check_case(store, shape_of(tiny, tokens), path, false, 16, 300 + tokens);
}

// Every launch variant of the sm_90 grouped GEMM (tile, pipeline, persistent grid) computes the same
// function.
TEST_CASE("grouped GEMM variants agree", "[gpu][small][sanitize]") {
  using T = kernels::detail::GroupedTuning;
  const T saved = kernels::detail::grouped_tuning();
  const ModelSpec tiny{"tiny-shared", 8, 2, 256, 128, 1};
  ExpertStore store(tiny, 9, 3);
  for (T::Tile tile : {T::kPair, T::kPairInFlight, T::kWide, T::kGrid})
    for (int mode = 0; mode < 4; ++mode) {
      const bool persistent = mode & 1;
      kernels::detail::grouped_tuning() = T{tile, persistent, mode / 2};
      INFO("tile " << static_cast<int>(tile) << " persistent " << persistent << " order " << mode / 2);
      for (int tokens : {37, 3000})
        check_case(store, shape_of(tiny, tokens), MoePath::kGrouped, false, 16, 500 + tokens);
    }
  kernels::detail::grouped_tuning() = saved;
}

TEST_CASE("grouped GEMM variants on a model shape", "[gpu][variants]") {
  using T = kernels::detail::GroupedTuning;
  const T saved = kernels::detail::grouped_tuning();
  ExpertStore store(kQwen15, 13);
  for (T::Tile tile : {T::kPair, T::kPairInFlight, T::kWide, T::kGrid})
    for (int mode = 0; mode < 4; ++mode) {
      const bool persistent = mode & 1;
      kernels::detail::grouped_tuning() = T{tile, persistent, mode / 2};
      INFO("tile " << static_cast<int>(tile) << " persistent " << persistent << " order " << mode / 2);
      check_case(store, shape_of(kQwen15, 1024), MoePath::kGrouped, false, 48, 4000);
    }
  kernels::detail::grouped_tuning() = saved;
}
