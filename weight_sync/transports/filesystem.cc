// filesystem transport: <dir>/v<version>/ holds Hugging Face-compatible safetensors shards
// (model-0000k-of-0000N.safetensors + model.safetensors.index.json, tensors in their source dtype),
// manifest.json (layout, payload, per-shard and per-bucket xxh3), optional payload/bucket-NNNNN.bin
// (the encoded stream when the payload is not plain full), and STABLE, written last.
//
// Readers only open versions with STABLE, take a lease (a file under v<version>/.leases/ held with
// flock(LOCK_SH), released by the kernel if the reader dies), and verify every checksum before any
// byte reaches the sink; the files are immutable while leased, so both apply modes are atomic.
// The writer keeps the newest keep_last versions; to remove an older one it first unlinks STABLE,
// then looks for live leases (flock(LOCK_EX|LOCK_NB) fails), restoring STABLE if one exists.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include "weight_sync/xxh.h"

#include "common/file.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "weight_sync/codec.h"
#include "weight_sync/transport.h"
#include "weight_sync/wire.h"

namespace fs = std::filesystem;

namespace arlo::weight_sync {
namespace {

std::unexpected<Error> io_error(const std::string& what, const fs::path& p) {
  return make_error(ErrorCode::kIo, what + " " + p.string() + ": " + std::strerror(errno));
}

Result<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, "cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A read-only mapping of a whole file.
class Mapped {
 public:
  static Result<Mapped> open(const fs::path& path) {
    Mapped m;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error("open", path);
    struct stat st {};
    ::fstat(fd, &st);
    m.size_ = static_cast<std::size_t>(st.st_size);
    if (m.size_ > 0) {
      void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return io_error("mmap", path);
      }
      ::madvise(p, m.size_, MADV_SEQUENTIAL);
      m.data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
    return m;
  }
  Mapped() = default;
  Mapped(Mapped&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Mapped& operator=(Mapped&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Mapped() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Drops the page-table entries of a read-only file mapping range (the page cache keeps the data):
// mapped shards then never add more than one window to the reader's RSS.
void release_mapped(std::span<const std::byte> range) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(range.data()) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(range.data()) + range.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

constexpr std::size_t kWindow = 32u << 20;

// The version of a directory named v<N>; nullopt for any other name (and for an N past 2^63).
std::optional<Version> parse_version_dir(const std::string& name) {
  if (name.size() < 2 || name[0] != 'v') return std::nullopt;
  auto v = version_from_text(std::string_view(name).substr(1), name);
  return v ? std::optional<Version>(*v) : std::nullopt;
}

// One shard of a version as manifest.json lists it, checked: a plain file name inside the version
// directory (never a path: "../x" or "/x" would read outside it), tensor indices of the manifest.
struct ShardRef {
  std::string file;
  std::vector<std::size_t> tensors;
  std::uint64_t checksum = 0;
};

Result<std::vector<ShardRef>> parse_shards(const nlohmann::json& mj, std::size_t tensor_count) {
  const auto bad = [](std::string what) { return make_error(ErrorCode::kParse, "manifest.json: " + what); };
  if (!mj.contains("shards") || !mj["shards"].is_array()) return bad("\"shards\" is missing or not a list");
  std::vector<ShardRef> out;
  for (std::size_t k = 0; k < mj["shards"].size(); ++k) {
    const auto& j = mj["shards"][k];
    const std::string at = fmt::format("shards[{}]", k);
    if (!j.is_object() || !j.contains("file") || !j["file"].is_string() || !j.contains("checksum") ||
        !j["checksum"].is_number_unsigned() || !j.contains("tensors") || !j["tensors"].is_array())
      return bad(at + ": expected {\"file\": name, \"tensors\": [indices], \"checksum\": xxh3}");
    ShardRef r{j["file"].get<std::string>(), {}, j["checksum"].get<std::uint64_t>()};
    if (r.file.empty() || r.file.front() == '.' || r.file.find('/') != std::string::npos ||
        r.file.find('\\') != std::string::npos || r.file.find('\0') != std::string::npos)
      return bad(fmt::format("{}: file '{}' is not a plain file name in the version directory", at, r.file));
    for (const auto& t : j["tensors"]) {
      if (!t.is_number_unsigned() || t.get<std::size_t>() >= tensor_count)
        return bad(
            fmt::format("{}: tensor index {} is not one of the manifest's {} tensors", at, t.dump(), tensor_count));
      r.tensors.push_back(t.get<std::size_t>());
    }
    out.push_back(std::move(r));
  }
  return out;
}

fs::path version_dir(const fs::path& root, Version v) { return root / fmt::format("v{}", v); }

std::string shard_name(std::size_t k, std::size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
}

// True when any lease file under `vdir` is held by a live process.
bool leased(const fs::path& vdir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(vdir / ".leases", ec)) {
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    ::close(fd);
    if (held) return true;
    fs::remove(e.path(), ec);  // stale: its holder died or released without removing
  }
  return false;
}

// Shards: whole tensors in order, each shard up to `shard_bytes` (a larger tensor gets its own).
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<TensorSpec>& specs, std::uint64_t shard_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::uint64_t cur = 0;
  for (std::size_t t = 0; t < specs.size(); ++t) {
    const std::uint64_t b = specs[t].nbytes();
    if (shards.empty() || (cur + b > shard_bytes && cur > 0)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
  }
  return shards;
}

class FsSender final : public SenderTransport {
 public:
  explicit FsSender(const SenderState& s) : root_(s.params.at("dir").get<std::string>()) {}
  nlohmann::json endpoint() const override { return {{"dir", root_.string()}}; }

  Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state, Deadline) override {
    const auto t0 = Clock::now();
    const Options& o = state.options;
    PayloadOptions payload = o.payload;
    std::optional<Version> base;
    if (payload.kind == PayloadKind::kDelta) {
      if (state.base && state.last_version && state.base->specs() == source.specs())
        base = state.last_version;
      else
        payload.kind = PayloadKind::kFull;  // nothing to diff against yet
    }
    ARLO_ASSIGN_OR_RETURN(Manifest m, Manifest::plan(source.specs(), o.bucket_bytes, payload));
    m.version = version;
    m.base_version = base;

    std::error_code ec;
    fs::create_directories(root_, ec);
    const fs::path vdir = version_dir(root_, version);
    if (fs::exists(vdir / "STABLE")) {
      // A resumed trainer publishing the version it resumed from: the files are already there.
      ARLO_INFO("weight_sync filesystem: v{} is already on disk in {}", version, root_.string());
      PublishReport report;
      report.version = version;
      report.payload = m.payload.kind;
      report.raw_bytes = m.total_bytes;
      return report;
    }
    fs::remove_all(vdir, ec);  // a partial write from a crashed publisher
    if (!fs::create_directories(vdir / ".leases", ec) && ec) return io_error("mkdir", vdir);

    // 1. HF shards; 2. the encoded stream, when it differs from the shards.
    ARLO_ASSIGN_OR_RETURN(const Shards shards, write_shards(vdir, m, source, o.bucket_bytes));
    const bool has_payload = m.payload.kind != PayloadKind::kFull || m.payload.zstd;
    std::uint64_t payload_bytes = 0;
    if (has_payload) {
      ARLO_ASSIGN_OR_RETURN(payload_bytes, write_payload(vdir, m, source, state));
    }

    // 3. manifest.json, then STABLE last.
    nlohmann::json mj = m.to_json();
    mj["shards"] = shards.info;
    mj["has_payload"] = has_payload;
    ARLO_TRY(write_file_atomically(vdir / "manifest.json", mj.dump()));
    ARLO_TRY(write_file_atomically(vdir / "STABLE", std::to_string(version) + "\n"));
    retire_old(o.keep_last);

    PublishReport r;
    r.version = version;
    r.payload = m.payload.kind;
    r.raw_bytes = m.total_bytes;
    r.wire_bytes = has_payload ? payload_bytes : shards.wire;
    r.buckets = has_payload ? m.buckets.size() : shards.info.size();
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.peers.push_back({root_.string(), true, "", shards.wire + payload_bytes});
    return r;
  }

 private:
  struct Shards {
    nlohmann::json info = nlohmann::json::array();  // per shard: {"file", "tensors", "checksum"}
    std::uint64_t wire = 0;                         // bytes written
  };

  // Step 1: the HF shards and their index in `vdir`, written straight from the source views and
  // hashed while written (the checksums go into the manifest's "shards").
  Result<Shards> write_shards(const fs::path& vdir, const Manifest& m, const WeightSource& source,
                              std::uint64_t shard_bytes) {
    const auto shards = plan_shards(m.tensors, shard_bytes);
    nlohmann::json weight_map = nlohmann::json::object();
    Shards out;
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shard_name(k, shards.size());
      std::vector<safetensors::TensorDecl> decls;
      for (auto t : shards[k]) decls.push_back({m.tensors[t].name, m.tensors[t].dtype, m.tensors[t].shape});
      ARLO_ASSIGN_OR_RETURN(auto writer, safetensors::Writer::create(vdir / name, decls, {{"format", "pt"}}));
      XXH3_state_t st;
      XXH3_64bits_reset(&st);
      for (auto t : shards[k]) {
        ARLO_ASSIGN_OR_RETURN(auto v, source.view(t));
        if (!v.device.is_cpu())
          return make_error(ErrorCode::kInvalidArgument, "tensor '" + v.spec->name + "' is on " + v.device.str());
        XXH3_64bits_update(&st, v.bytes.data(), v.bytes.size());
        ARLO_TRY(writer.write(v.bytes));
        weight_map[m.tensors[t].name] = name;
        out.wire += v.bytes.size();
      }
      ARLO_TRY(writer.finish());
      out.info.push_back({{"file", name}, {"tensors", shards[k]}, {"checksum", XXH3_64bits_digest(&st)}});
    }
    nlohmann::json index = {{"metadata", {{"total_size", m.total_bytes}}}, {"weight_map", weight_map}};
    ARLO_TRY(write_file_atomically(vdir / "model.safetensors.index.json", index.dump(2)));
    return out;
  }

  // Step 2 (payloads that differ from the shards: delta or zstd): the encoded stream in
  // vdir/payload/bucket-NNNNN.bin; appends each bucket's checksum to m.checksums. Returns its bytes.
  Result<std::uint64_t> write_payload(const fs::path& vdir, Manifest& m, const WeightSource& source,
                                      const SenderState& state) {
    std::error_code ec;
    fs::create_directories(vdir / "payload", ec);
    ARLO_ASSIGN_OR_RETURN(auto enc, BucketEncoder::create(m, source, state.base.get()));
    std::unique_ptr<std::byte[]> buf(new std::byte[std::max<std::uint64_t>(enc.max_capacity(), 1)]);
    std::uint64_t payload_bytes = 0;
    for (std::size_t i = 0; i < m.buckets.size(); ++i) {
      ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {buf.get(), enc.capacity(i)}));
      m.checksums.push_back(b.checksum);
      const fs::path p = vdir / "payload" / fmt::format("bucket-{:05d}.bin", i);
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) return io_error("create", p);
      for (const auto& part : b.parts) {
        const std::byte* q = part.data();
        std::size_t left = part.size();
        while (left > 0) {
          ssize_t n = ::write(fd, q, left);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            ::close(fd);
            return io_error("write", p);
          }
          q += n;
          left -= static_cast<std::size_t>(n);
        }
      }
      ::close(fd);
      payload_bytes += b.wire_bytes;
    }
    return payload_bytes;
  }

  void retire_old(std::size_t keep_last) {
    std::vector<Version> stable;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      auto v = parse_version_dir(e.path().filename().string());
      if (v && fs::exists(e.path() / "STABLE")) stable.push_back(*v);
    }
    std::sort(stable.begin(), stable.end(), std::greater<>());
    for (std::size_t k = keep_last; k < stable.size(); ++k) {
      const fs::path vdir = version_dir(root_, stable[k]);
      const fs::path hidden = vdir / "STABLE.retiring";
      if (::rename((vdir / "STABLE").c_str(), hidden.c_str()) != 0) continue;
      if (leased(vdir)) {
        ::rename(hidden.c_str(), (vdir / "STABLE").c_str());  // a reader holds it: keep
        continue;
      }
      fs::remove_all(vdir, ec);
    }
  }

  fs::path root_;
};

// A held lease on one version directory. Released (and its file removed) on destruction.
class Lease {
 public:
  static Result<Lease> take(const fs::path& vdir) {
    static std::atomic<int> counter{0};
    Lease l;
    l.path_ = vdir / ".leases" / fmt::format("{}-{}", ::getpid(), counter++);
    l.fd_ = ::open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (l.fd_ < 0) return io_error("create lease", l.path_);
    if (::flock(l.fd_, LOCK_SH) != 0) return io_error("lock lease", l.path_);
    return l;
  }
  Lease() = default;
  Lease(Lease&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
  ~Lease() {
    if (fd_ >= 0) {
      std::error_code ec;
      fs::remove(path_, ec);
      ::close(fd_);
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

class FsReceiver final : public ReceiverTransport {
 public:
  explicit FsReceiver(const ReceiverState& s)
      : root_(s.params.at("dir").get<std::string>()), poll_(s.params.at("poll_interval_ms").get<std::int64_t>()) {}

  Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) override {
    const auto t0 = Clock::now();
    while (true) {
      auto v = newest_stable(state.version);
      if (v) {
        const fs::path vdir = version_dir(root_, *v);
        auto lease = Lease::take(vdir);
        if (lease && fs::exists(vdir / "STABLE")) {
          auto r = apply(*v, vdir, sink, state);
          if (r) r->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
          return r;
        }
        // Retired between listing and leasing: look again.
      }
      if (Clock::now() >= deadline)
        return make_error(ErrorCode::kTimeout, "no STABLE version newer than " +
                                                   (state.version ? std::to_string(*state.version) : "none") +
                                                   " appeared in " + root_.string() + " before the deadline");
      std::this_thread::sleep_for(std::min<Clock::duration>(poll_, deadline - Clock::now()));
    }
  }

 private:
  std::optional<Version> newest_stable(std::optional<Version> above) {
    std::optional<Version> best;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      auto v = parse_version_dir(e.path().filename().string());
      if (!v || (above && *v <= *above)) continue;
      if (!fs::exists(e.path() / "STABLE")) continue;
      if (!best || *v > *best) best = v;
    }
    return best;
  }

  Result<ReceiveReport> apply(Version v, const fs::path& vdir, WeightSink& sink, ReceiverState& state) {
    const std::string where = fmt::format("v{} in {}", v, root_.string());
    ARLO_ASSIGN_OR_RETURN(auto text, read_text(vdir / "manifest.json"));
    auto mj = nlohmann::json::parse(text, nullptr, false);
    if (mj.is_discarded()) return make_error(ErrorCode::kParse, where + ": manifest.json is not valid JSON");
    ARLO_ASSIGN_OR_RETURN(Manifest m, with_context(Manifest::from_json(mj), where));
    if (m.version != v)
      return make_error(ErrorCode::kMismatch, where + ": manifest names version " + std::to_string(m.version));
    // Refuse a mismatched manifest before reading any tensor data.
    ARLO_ASSIGN_OR_RETURN(auto dest, with_context(bind_sink(m, sink), where));

    ReceiveReport report;
    report.version = v;
    report.path = "filesystem";
    const bool payload_usable =
        mj.value("has_payload", false) && (m.payload.kind != PayloadKind::kDelta ||
                                           (state.version && m.base_version && *state.version == *m.base_version));
    if (payload_usable) {
      // Encoded stream: verify every bucket, then decode. Each file is mapped only while it is
      // used, so mapped page cache never adds more than one bucket to the reader's RSS.
      auto bucket_path = [&](std::size_t i) { return vdir / "payload" / fmt::format("bucket-{:05d}.bin", i); };
      for (std::size_t i = 0; i < m.buckets.size(); ++i) {
        ARLO_ASSIGN_OR_RETURN(auto f, with_context(Mapped::open(bucket_path(i)), where));
        if (xxh3(f.bytes()) != m.checksums.at(i))
          return make_error(ErrorCode::kMismatch, where + ": bucket " + std::to_string(i) + " (" +
                                                      bucket_path(i).string() +
                                                      "): checksum mismatch; previous version kept");
        report.wire_bytes += f.bytes().size();
      }
      for (std::size_t i = 0; i < m.buckets.size(); ++i) {
        auto f = Mapped::open(bucket_path(i));
        auto s = f ? decode_bucket(m, i, f->bytes(), dest) : Status(std::unexpected(f.error()));
        if (!s) {
          sink.discard(v, s.error());
          state.version.reset();
          return make_error(s.error().code(), where + ": " + s.error().what());
        }
      }
      report.payload = m.payload.kind;
      report.buckets = m.buckets.size();
    } else {
      // Shards (full resync): verify every shard, then copy.
      ARLO_ASSIGN_OR_RETURN(auto shards, with_context(parse_shards(mj, m.tensors.size()), where));
      for (std::size_t k = 0; k < shards.size(); ++k) {
        const fs::path p = vdir / shards[k].file;
        ARLO_ASSIGN_OR_RETURN(auto f, with_context(safetensors::File::open(p), where));
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        for (auto ti : shards[k].tensors) {
          const auto& spec = m.tensors[ti];
          auto bytes = f.data(spec.name);
          if (!bytes || bytes->size() != spec.nbytes())
            return make_error(ErrorCode::kMismatch, where + ": shard " + p.filename().string() + " lacks tensor '" +
                                                        spec.name + "' of the manifest's size");
          for (std::size_t off = 0; off < bytes->size(); off += kWindow) {
            const auto w = bytes->subspan(off, std::min(kWindow, bytes->size() - off));
            XXH3_64bits_update(&st, w.data(), w.size());
            release_mapped(w);
          }
          report.wire_bytes += bytes->size();
        }
        if (XXH3_64bits_digest(&st) != shards[k].checksum)
          return make_error(ErrorCode::kMismatch, where + ": shard " + std::to_string(k) + " (" +
                                                      p.filename().string() +
                                                      "): checksum mismatch; previous version kept");
      }
      // Every shard verified (and leased, so immutable): copy, one mapping at a time.
      for (const auto& shard : shards) {
        auto f = safetensors::File::open(vdir / shard.file);
        if (!f) {
          sink.discard(v, f.error());
          state.version.reset();
          return make_error(f.error().code(), where + ": " + f.error().what());
        }
        for (const auto ti : shard.tensors) {
          auto bytes = *f->data(m.tensors[ti].name);
          for (std::size_t off = 0; off < bytes.size(); off += kWindow) {
            const auto w = bytes.subspan(off, std::min(kWindow, bytes.size() - off));
            std::memcpy(dest[ti].data() + off, w.data(), w.size());
            release_mapped(w);
          }
        }
      }
      report.payload = PayloadKind::kFull;
      report.buckets = shards.size();
    }
    if (auto s = sink.commit(v); !s) {
      state.version.reset();
      return make_error(s.error().code(), where + ": sink commit: " + s.error().what());
    }
    state.version = v;
    state.specs = m.tensors;
    report.version = v;
    return report;
  }

  fs::path root_;
  std::chrono::milliseconds poll_;
};

}  // namespace

namespace {
Status need_dir(const nlohmann::json& params) {
  if (params.at("dir").get<std::string>().empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "weight_sync filesystem: 'dir' (where versions v<N>/ live) is required");
  return ok();
}
}  // namespace

TransportDescriptor filesystem_transport() {
  TransportDescriptor d;
  d.name = "filesystem";
  d.doc = "safetensors shards under dir/v<N>/ (durable; also what vLLM and SGLang load from disk)";
  d.capabilities = {.durable = true};
  d.options = {
      string_option("dir", "", "where versions v<N>/ are written").user_key("{run.dir}/weights").is_path(),
      int_option("poll_interval_ms", 50, "how often a receiver looks for a new STABLE version").range(1, 60000),
  };
  d.sender = [](const SenderState& s) -> Result<std::unique_ptr<SenderTransport>> {
    ARLO_TRY(need_dir(s.params));
    return std::unique_ptr<SenderTransport>(new FsSender(s));
  };
  d.receiver = [](const ReceiverState& s) -> Result<std::unique_ptr<ReceiverTransport>> {
    ARLO_TRY(need_dir(s.params));
    return std::unique_ptr<ReceiverTransport>(new FsReceiver(s));
  };
  d.version_path = [](const nlohmann::json& endpoint, Version v) {
    return version_dir(endpoint.value("dir", std::string()), v).string();
  };
  return d;
}

}  // namespace arlo::weight_sync
