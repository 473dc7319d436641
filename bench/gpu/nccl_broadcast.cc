// arlo-bench-nccl: the NCCL weight transport on one GPU.
//   --smoke: 1-rank communicator: init, warm-up, a broadcast in each layout, and an init whose
//            peer never joins aborted at its deadline. Exit status 0 only if all of it worked.
//   default: broadcasts a Qwen3 bf16 set (qwen3-1.7b: ~1.7e9 parameters, ~3.4 GB) from device
//            buffers through Group::send, and prints time and GB/s against a device-to-device
//            cudaMemcpyAsync of the same bytes measured in the same run (ratio = memcpy time /
//            broadcast time). One rank, so this measures arlo's packing and NCCL's launch path,
//            not a network.
// Exit status 2 when no CUDA device is usable, 1 on any other failure.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "weight_sync/qwen3.h"
#include "weight_sync/transports/nccl/backend.h"
#include "weight_sync/transports/nccl/group.h"

namespace ws = arlo::weight_sync;
namespace nccl = arlo::weight_sync::nccl;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "arlo-bench-nccl: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(arlo::Result<T> r, const std::string& what) {
  if (!r) die(what + ": " + r.error().what());
  return std::move(*r);
}
void must(arlo::Status s, const std::string& what) {
  if (!s) die(what + ": " + s.error().what());
}

// Tensors laid out back to back in one device allocation.
class DeviceSource final : public ws::WeightSource {
 public:
  DeviceSource(std::vector<ws::TensorSpec> specs, std::byte* base) : specs_(std::move(specs)), base_(base) {
    std::uint64_t offset = 0;
    for (const auto& s : specs_) {
      offsets_.push_back(offset);
      offset += s.nbytes();
    }
  }
  const std::vector<ws::TensorSpec>& specs() const override { return specs_; }
  arlo::Result<ws::TensorView> view(std::size_t i) const override {
    return ws::TensorView{&specs_[i], {base_ + offsets_[i], specs_[i].nbytes()}, ws::Device::cuda(0)};
  }

 private:
  std::vector<ws::TensorSpec> specs_;
  std::vector<std::uint64_t> offsets_;
  std::byte* base_;
};

std::uint64_t payload(const std::vector<ws::TensorSpec>& specs) {
  std::uint64_t n = 0;
  for (const auto& s : specs) n += s.nbytes();
  return n;
}

struct Timing {
  std::vector<double> seconds;
  double best() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

void print_row(const std::string& name, std::uint64_t bytes, const Timing& t, double memcpy_best) {
  std::printf("%-44s best %9.3f ms  median %9.3f ms  %8.1f GB/s", name.c_str(), t.best() * 1e3, t.median() * 1e3,
              static_cast<double>(bytes) / t.best() / 1e9);
  if (memcpy_best > 0) std::printf("  ratio %.3f", memcpy_best / t.best());
  std::printf("\n");
  std::fflush(stdout);
}

// One device-to-device cudaMemcpyAsync of `bytes`, waited for by spinning on its event.
double time_memcpy(nccl::Backend& b, void* dst, const void* src, std::uint64_t bytes) {
  auto stream = must(b.stream_create(), "cudaStreamCreate");
  auto event = must(b.event_create(), "cudaEventCreate");
  auto start = ws::Clock::now();
  must(b.copy_async(dst, src, bytes, nccl::CopyKind::kDeviceToDevice, stream), "device-to-device copy");
  must(b.event_record(event, stream), "cudaEventRecord");
  while (!must(b.event_done(event), "cudaEventQuery")) {
    if (ws::Clock::now() - start > 120s) die("device-to-device copy did not finish in 120 s");
  }
  double s = std::chrono::duration<double>(ws::Clock::now() - start).count();
  b.event_destroy(event);
  b.stream_destroy(stream);
  return s;
}

std::unique_ptr<nccl::Group> one_rank_group(const std::string& library) {
  auto id = must(nccl::new_unique_id(library), "ncclGetUniqueId");
  nccl::GroupConfig config{
      .library_path = library, .world_size = 1, .rank = 0, .device = 0, .collective_timeout = 120s};
  auto group = must(nccl::Group::start(config, id), "start a 1-rank group");
  auto start = ws::Clock::now();
  must(group->wait_ready(ws::deadline_in(120s)), "init");
  std::printf("init (1 rank): %.1f ms\n", std::chrono::duration<double>(ws::Clock::now() - start).count() * 1e3);
  start = ws::Clock::now();
  must(group->warmup(ws::deadline_in(120s)), "warm-up all-reduce");
  std::printf("warm-up all-reduce: %.3f ms\n", std::chrono::duration<double>(ws::Clock::now() - start).count() * 1e3);
  return group;
}

int smoke(const std::string& library, nccl::Backend& backend) {
  auto group = one_rank_group(library);
  auto specs = must(ws::model_layout("qwen3-0.6b", ws::DType::BF16, 0.05), "layout");
  const std::uint64_t bytes = payload(specs);
  auto* base = static_cast<std::byte*>(must(backend.device_alloc(bytes), "device buffer"));
  DeviceSource source(specs, base);
  for (const nccl::Layout& layout :
       {nccl::Layout{.packed = true, .packed_buffer_bytes = 8u << 20}, nccl::Layout{.packed = false}}) {
    auto report = must(group->send(source, layout, ws::deadline_in(120s)), "broadcast");
    std::printf("smoke broadcast %-10s %zu tensors, %zu broadcasts, %.1f MB, %.3f ms\n",
                layout.packed ? "packed" : "per-tensor", specs.size(), report.collectives,
                static_cast<double>(report.bytes) / 1e6, report.seconds * 1e3);
  }
  group.reset();
  backend.device_free(base);

  // A 2-rank group whose second rank never joins: the init must be aborted at its deadline.
  auto id = must(nccl::new_unique_id(library), "ncclGetUniqueId");
  nccl::GroupConfig two{.library_path = library, .world_size = 2, .rank = 0, .device = 0, .collective_timeout = 30s};
  auto pending = must(nccl::Group::start(two, id), "start a 2-rank group");
  auto start = ws::Clock::now();
  auto ready = pending->wait_ready(ws::deadline_in(3s));
  double took = std::chrono::duration<double>(ws::Clock::now() - start).count();
  if (ready || ready.error().code() != arlo::ErrorCode::kTimeout || !pending->aborted()) {
    die(std::string("the init with a missing peer was not aborted at its deadline: ") +
        (ready ? "it succeeded" : ready.error().what()));
  }
  if (took > 60) die("ncclCommAbort took " + std::to_string(took) + " s");
  std::printf("smoke abort: init with a missing peer aborted after %.3f s (deadline 3 s): %s\n", took,
              ready.error().what().c_str());
  std::printf("smoke: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"arlo-bench-nccl: the NCCL weight transport on one GPU"};
  std::string library = nccl::kDefaultLibraryPath;
  std::string model = "qwen3-1.7b";
  int iterations = 5;
  std::uint64_t buffer_mib = 1024;
  int buffers = 2;
  bool run_smoke = false, host = true;
  app.add_option("--library", library, "libnccl.so.2 to load (the inference servers' version)");
  app.add_option("--model", model, "tensor layout: qwen3-0.6b | qwen3-1.7b");
  app.add_option("--iterations", iterations, "timed repetitions of each measurement")->check(CLI::Range(1, 1000));
  app.add_option("--buffer-mib", buffer_mib, "packed_buffer_size_bytes in MiB (vLLM's default: 1024)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--buffers", buffers, "packed_num_buffers")->check(CLI::Range(1, 16));
  app.add_flag("--smoke", run_smoke, "1-rank smoke test instead of the benchmark");
  app.add_flag("!--no-host", host, "skip the host-memory (pinned staging) measurement");
  CLI11_PARSE(app, argc, argv);

  auto backend = must(nccl::open_backend(library), "load " + library);
  if (auto s = backend->set_device(0); !s) {
    std::fprintf(stderr, "arlo-bench-nccl: no usable CUDA device: %s\n", s.error().what().c_str());
    return 2;
  }
  std::printf("libnccl %s: version %s\n", library.c_str(), must(backend->version(), "ncclGetVersion").c_str());
  if (run_smoke) return smoke(library, *backend);

  auto specs = must(ws::model_layout(model, ws::DType::BF16), "model layout");
  const std::uint64_t bytes = payload(specs);
  std::printf("%s bf16: %zu tensors, %.3f GB (%.3f G parameters)\n", model.c_str(), specs.size(), bytes / 1e9,
              bytes / 2e9);
  auto* src = static_cast<std::byte*>(must(backend->device_alloc(bytes), "device source buffer"));
  auto* dst = static_cast<std::byte*>(must(backend->device_alloc(bytes), "device copy target"));

  Timing copy;
  time_memcpy(*backend, dst, src, bytes);  // warm
  for (int i = 0; i < iterations; ++i) copy.seconds.push_back(time_memcpy(*backend, dst, src, bytes));
  print_row("device-to-device cudaMemcpyAsync", bytes, copy, 0);
  const double memcpy_best = copy.best();

  auto group = one_rank_group(library);
  DeviceSource source(specs, src);
  auto measure = [&](const std::string& name, const ws::WeightSource& from, const nccl::Layout& layout) {
    Timing t;
    std::size_t collectives = 0;
    must(group->send(from, layout, ws::deadline_in(300s)), name + " (warm-up)");
    for (int i = 0; i < iterations; ++i) {
      auto start = ws::Clock::now();
      auto report = must(group->send(from, layout, ws::deadline_in(300s)), name);
      t.seconds.push_back(std::chrono::duration<double>(ws::Clock::now() - start).count());
      collectives = report.collectives;
    }
    print_row(name + " [" + std::to_string(collectives) + " bcast]", bytes, t, memcpy_best);
  };
  const nccl::Layout packed{.packed = true, .packed_buffer_bytes = buffer_mib << 20, .packed_num_buffers = buffers};
  measure("nccl packed " + std::to_string(buffer_mib) + " MiB x " + std::to_string(buffers) + ", device", source,
          packed);
  measure("nccl per-tensor, device", source, nccl::Layout{.packed = false});
  if (host) {
    ws::HostWeights host_weights(specs);  // zero pages: reading them costs no RSS
    measure("nccl packed, host (pinned staging)", host_weights, packed);
  }
  group.reset();
  backend->device_free(dst);
  backend->device_free(src);
  return 0;
}
