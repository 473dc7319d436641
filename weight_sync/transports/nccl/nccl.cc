// The nccl transport: the trainer is rank 0 of one NCCL communicator with every receiver's GPUs,
// and broadcasts each version from its staging memory. vLLM and SGLang servers join as they would
// with a Python trainer (rendezvous.h: the id forms they read from a TCPStore-compatible store);
// arlo's own receiver joins the same way (group.h).
//
// The publisher runs two stores (store.h): the control store at `address` (announced), through which
// the orchestrator forms groups and members say they are receiving (collective.h; keys below), and
// per group a rendezvous store on a fresh port where the members read the unique id. A failed or
// aborted transfer kills the group; the next group is a new generation on a new port.
//
// Control-store keys (values JSON unless said):
//   arlo/tensors                     publisher: [{"name", "dtype", "shape"}] of every version
//   arlo/newest                      publisher: the newest staged version (decimal)
//   arlo/generation                  orchestrator: ADD 1 gives a new generation g
//   arlo/group/<g>/request           orchestrator: {"members": [{"name", "world_size", "flavor"}]}
//   arlo/group/<g>/ready             publisher: {"members": {name: join}} or {"error"}
//   arlo/member/<name>               publisher: the join of `name` in the newest group
//   arlo/group/<g>/want/<v>          members: ADD 1 each when receiving v
//   arlo/group/<g>/sent/<v>          publisher: {"version", "checksum"} or {"error"} once the broadcast ended
//   arlo/group/<g>/abort             a member or the orchestrator: the reason; the transfer aborts
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "weight_sync/collective.h"
#include "weight_sync/transport.h"
#include "weight_sync/wire.h"
#include "weight_sync/transports/nccl/group.h"
#include "weight_sync/transports/nccl/layout.h"
#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync {
namespace nccl {
namespace {

using nlohmann::json;

constexpr std::string_view kTensorsKey = "arlo/tensors";
constexpr std::string_view kNewestKey = "arlo/newest";
constexpr std::string_view kGenerationKey = "arlo/generation";
constexpr std::string_view kArloUniqueIdKey = "arlo/unique_id";  // in the rendezvous store: the raw id

std::string group_key(std::int64_t g, std::string_view what) { return fmt::format("arlo/group/{}/{}", g, what); }
std::string want_key(std::int64_t g, Version v) { return fmt::format("arlo/group/{}/want/{}", g, v); }
std::string sent_key(std::int64_t g, Version v) { return fmt::format("arlo/group/{}/sent/{}", g, v); }
std::string member_key(std::string_view name) { return fmt::format("arlo/member/{}", name); }

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};

Result<HostPort> split_host_port(std::string_view text, std::string_view what) {
  const auto colon = text.rfind(':');
  HostPort hp;
  unsigned value = 0;
  if (colon == std::string_view::npos || colon == 0) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("nccl {}: '{}' is not host:port", what, text));
  }
  const auto digits = text.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || value > 65535) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("nccl {}: '{}' has no valid port", what, text));
  }
  hp.host = std::string(text.substr(0, colon));
  hp.port = static_cast<std::uint16_t>(value);
  return hp;
}

// Parses "arlo/group/<g>/<what>/<v>" (v optional); false for any other key.
bool parse_group_key(std::string_view key, std::int64_t& g, std::string& what, std::optional<Version>& v) {
  constexpr std::string_view prefix = "arlo/group/";
  if (!key.starts_with(prefix)) return false;
  key.remove_prefix(prefix.size());
  const auto slash = key.find('/');
  if (slash == std::string_view::npos) return false;
  if (std::from_chars(key.data(), key.data() + slash, g).ec != std::errc()) return false;
  key.remove_prefix(slash + 1);
  const auto slash2 = key.find('/');
  what = std::string(key.substr(0, slash2));
  v.reset();
  if (slash2 != std::string_view::npos) {
    auto n = version_from_text(key.substr(slash2 + 1), key);
    if (!n) return false;
    v = *n;
  }
  return true;
}

Result<json> parse_json_value(const std::string& text, std::string_view key) {
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    return make_error(ErrorCode::kParse, fmt::format("nccl control key {}: not JSON: {}", key, text.substr(0, 200)));
  return j;
}

Result<json> tensors_json(const std::vector<TensorSpec>& specs) {
  json out = json::array();
  for (const auto& s : specs) {
    auto dtype = torch_dtype_name(s.dtype);
    if (!dtype) return std::unexpected(std::move(dtype).error().with_context(fmt::format("tensor '{}'", s.name)));
    out.push_back({{"name", s.name}, {"dtype", *dtype}, {"shape", s.shape}});
  }
  return out;
}

Result<std::vector<TensorSpec>> specs_from_json(const json& j) {
  if (!j.is_array()) return make_error(ErrorCode::kParse, "nccl: arlo/tensors is not an array");
  std::vector<TensorSpec> out;
  for (const auto& t : j) {
    TensorSpec s;
    if (!t.is_object() || !t.contains("name") || !t.contains("dtype") || !t.contains("shape"))
      return make_error(ErrorCode::kParse, "nccl: arlo/tensors: each entry needs name, dtype and shape");
    s.name = t["name"].get<std::string>();
    bool found = false;
    for (DType d : {DType::BF16, DType::F16, DType::F32, DType::F64, DType::I8, DType::U8, DType::I32, DType::I64}) {
      auto n = torch_dtype_name(d);
      if (n && *n == t["dtype"].get<std::string>()) {
        s.dtype = d;
        found = true;
      }
    }
    if (!found)
      return make_error(ErrorCode::kParse,
                        fmt::format("nccl: tensor '{}': unknown dtype '{}'", s.name, t["dtype"].dump()));
    s.shape = t["shape"].get<std::vector<std::int64_t>>();
    out.push_back(std::move(s));
  }
  return out;
}

Layout layout_of(const json& join) {
  Layout l;
  l.packed = join.value("packed", true);
  l.packed_buffer_bytes = join.value("packed_buffer_size_bytes", l.packed_buffer_bytes);
  l.packed_num_buffers = join.value("packed_num_buffers", l.packed_num_buffers);
  return l;
}

// xxh3-64 of the bytes in `specs` order as weights_checksum() computes it over a source.
class SinkView final : public WeightSource {
 public:
  SinkView(WeightSink& sink, const std::vector<TensorSpec>& specs) : sink_(sink), specs_(specs) {}
  const std::vector<TensorSpec>& specs() const override { return specs_; }
  Result<TensorView> view(std::size_t i) const override {
    ARLO_ASSIGN_OR_RETURN(auto buf, sink_.buffer_for(specs_[i]));
    return TensorView{&specs_[i], {buf.data(), buf.size()}, sink_.device()};
  }

 private:
  WeightSink& sink_;
  const std::vector<TensorSpec>& specs_;
};

// What vLLM's and SGLang's processes set for their weight-update groups (research note: both sides
// must agree, or NCCL can hang): set before this process's first NCCL call, unless the user set them.
void default_nccl_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"}) {
      if (std::getenv(name) == nullptr) {
        ::setenv(name, "0", 0);
        ARLO_INFO("weight_sync nccl: {}=0 (as vLLM and SGLang set it; export it to choose otherwise)", name);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Publisher (rank 0).

struct Generation {
  std::int64_t id = 0;
  std::vector<GroupMember> members;
  int world_size = 0;
  Layout layout;
  bool warmup = false;
  bool checksum = false;                    // an arlo member verifies what it got
  std::unique_ptr<StoreServer> rendezvous;  // alive as long as the group (SGLang's heartbeat polls it)
  std::unique_ptr<Group> group;
  bool ready = false;    // init finished (and warmed up)
  bool warming = false;  // vLLM: the control thread runs init and the warm-up
  std::string dead;      // why the group is gone ("" while usable)
};

class NcclSender final : public SenderTransport {
 public:
  static Result<std::unique_ptr<SenderTransport>> create(const SenderState& s) {
    if (s.options.payload.kind != PayloadKind::kFull || s.options.payload.zstd)
      return make_error(ErrorCode::kInvalidArgument,
                        "nccl: the weights travel as trained (weight_sync.payload full, no zstd): peers allocate from "
                        "dtypes and shapes");
    default_nccl_environment();
    const auto& p = s.params;
    ARLO_ASSIGN_OR_RETURN(auto at, split_host_port(p.at("address").get<std::string>(), "address"));
    const std::string library = p.at("nccl_library").get<std::string>();
    ARLO_ASSIGN_OR_RETURN(auto version, library_version(library));
    ARLO_ASSIGN_OR_RETURN(auto control, StoreServer::start(at.host, at.port));
    std::string master = p.at("master_address").get<std::string>();
    if (master.empty()) master = at.host;
    if (master == "0.0.0.0" || master == "::")
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("nccl: address {} listens on every interface; set weight_sync.master_address to the "
                      "address the workers reach this host on",
                      at.host));
    auto sender = std::unique_ptr<NcclSender>(new NcclSender(
        s, std::move(control), std::move(at.host), std::move(master), std::move(library), std::move(version)));
    sender->begin();
    return std::unique_ptr<SenderTransport>(std::move(sender));
  }

  ~NcclSender() override {
    {
      std::lock_guard l(mu_);
      stop_ = true;
      if (gen_ && gen_->group) gen_->group->abort("the publisher stops");
    }
    cv_.notify_all();
    if (control_thread_.joinable()) control_thread_.join();
    control_.reset();  // its thread calls on_change: stop it before members go
  }

  json endpoint() const override {
    return {{"address", fmt::format("{}:{}", master_, control_->port())}, {"nccl_version", nccl_version_}};
  }

  Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                Deadline deadline) override {
    (void)state;
    if (!tensors_set_) {
      ARLO_ASSIGN_OR_RETURN(auto t, tensors_json(source.specs()));
      control_->set(std::string(kTensorsKey), t.dump());
      specs_ = source.specs();
      tensors_set_ = true;
    } else if (source.specs() != specs_) {
      return make_error(ErrorCode::kMismatch,
                        "nccl: the tensors changed between versions; peers allocate them once per run");
    }
    if (newest_ != version) {
      control_->set(std::string(kNewestKey), std::to_string(version));
      newest_ = version;
    }
    std::unique_lock l(mu_);
    std::vector<Version> wanted;
    const bool due = cv_.wait_until(l, deadline, [&] {
      wanted = due_wants(version);
      return stop_ || !wanted.empty();
    });
    if (stop_) return make_error(ErrorCode::kCancelled, "nccl: the publisher stops");
    if (!due) return make_error(ErrorCode::kUnavailable, "nccl: no group member is receiving");
    Generation& g = *gen_;
    for (auto v : wanted) served_.insert({g.id, v});
    l.unlock();
    auto report = transfer(g, version, source);
    json sent = report ? json{{"version", version}} : json{{"error", report.error().what()}};
    if (report && g.checksum) {
      auto sum = weights_checksum(source);
      if (sum) sent["checksum"] = checksum_hex(*sum);
    }
    for (auto v : wanted) control_->set(sent_key(g.id, v), sent.dump());
    if (!report) {
      std::lock_guard ll(mu_);
      kill(g, fmt::format("the transfer of v{} failed: {}", version, report.error().what()));
    }
    return report;
  }

 private:
  NcclSender(const SenderState& s, std::unique_ptr<StoreServer> control, std::string host, std::string master,
             std::string library, std::string version)
      : options_(s.options),
        params_(s.params),
        control_(std::move(control)),
        host_(std::move(host)),
        master_(std::move(master)),
        library_(std::move(library)),
        nccl_version_(std::move(version)) {}

  void begin() {
    control_->on_change([this](const std::string& key) { on_change(key); });
    control_thread_ = std::thread([this] { control_loop(); });
    ARLO_INFO("weight_sync nccl: control store at {}:{} (NCCL {})", master_, control_->port(), nccl_version_);
  }

  // Under mu_: versions <= `version` of the current group every member wants and nobody served.
  std::vector<Version> due_wants(Version version) const {
    std::vector<Version> out;
    if (!gen_ || !gen_->dead.empty() || gen_->warming) return out;
    const auto members = static_cast<std::int64_t>(gen_->members.size());
    for (const auto& [key, count] : wants_) {
      if (key.first == gen_->id && key.second <= version && count >= members && !served_.count(key))
        out.push_back(key.second);
    }
    return out;
  }

  // On the control store's thread: a key changed.
  void on_change(const std::string& key) {
    std::int64_t g = 0;
    std::string what;
    std::optional<Version> v;
    if (!parse_group_key(key, g, what, v)) return;
    auto value = control_->get(key);
    if (!value) return;
    std::lock_guard l(mu_);
    if (what == "request") {
      requests_.push_back({g, *value});
    } else if (what == "want" && v) {
      std::int64_t n = 0;
      std::from_chars(value->data(), value->data() + value->size(), n);
      wants_[{g, *v}] = n;
      if (!gen_ || gen_->id != g || !gen_->dead.empty()) {
        // Nothing will broadcast: answer now, so the member does not wait for its deadline.
        const std::string why = !gen_ || gen_->id < g ? fmt::format("group {} was never opened", g)
                                : gen_->id != g       ? fmt::format("group {} was replaced by group {}", g, gen_->id)
                                                      : fmt::format("group {} is gone: {}", g, gen_->dead);
        answers_.push_back({sent_key(g, *v), json{{"error", why}}.dump()});
      }
    } else if (what == "abort") {
      if (gen_ && gen_->id == g) kill(*gen_, "aborted by a member: " + *value);
    } else {
      return;
    }
    cv_.notify_all();
  }

  void control_loop() {
    std::unique_lock l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !requests_.empty() || !answers_.empty(); });
      if (stop_) return;
      auto answers = std::move(answers_);
      answers_.clear();
      std::deque<std::pair<std::int64_t, std::string>> requests;
      requests.swap(requests_);
      l.unlock();
      for (auto& [key, value] : answers) control_->set(key, value);
      for (auto& [g, request] : requests) {
        auto ready = open(g, request);
        control_->set(group_key(g, "ready"), ready.dump());
        if (!ready.contains("error")) warm_up(g);
      }
      l.lock();
    }
  }

  // Opens generation `g` (replacing the current one); the value of its ready key.
  json open(std::int64_t g, const std::string& request_text) {
    auto request = parse_json_value(request_text, group_key(g, "request"));
    if (!request) return {{"error", request.error().what()}};
    auto gen = std::make_unique<Generation>();
    gen->id = g;
    auto members = parse_members(*request, *gen);
    if (!members) return {{"error", members.error().what()}};
    {
      std::lock_guard l(mu_);
      if (gen_) {
        if (gen_->id >= g) return {{"error", fmt::format("group {} is older than the current group {}", g, gen_->id)}};
        kill(*gen_, fmt::format("replaced by group {}", g));
      }
    }
    auto opened = start_group(*gen);
    if (!opened) return {{"error", opened.error().what()}};
    json joins = json::object();
    int offset = 1;
    for (const auto& m : gen->members) {
      json join = *opened;
      join["rank_offset"] = offset;
      offset += m.world_size;
      control_->set(member_key(m.name), join.dump());
      joins[m.name] = std::move(join);
    }
    ARLO_INFO("weight_sync nccl: group {} of {} ranks ({} members), rendezvous at {}:{}", g, gen->world_size,
              gen->members.size(), master_, gen->rendezvous->port());
    std::lock_guard l(mu_);
    gen->warming = gen->warmup;
    old_.push_back(std::move(gen_));  // destroyed with the sender: a wedged peer may still hold its store
    gen_ = std::move(gen);
    cv_.notify_all();
    return {{"members", std::move(joins)}};
  }

  // vLLM's workers init and then all-reduce inside their init route, before any update: rank 0 does
  // the same right after the group opened (on this thread; transfers wait for it).
  void warm_up(std::int64_t g) {
    Generation* gen = nullptr;
    {
      std::lock_guard l(mu_);
      if (!gen_ || gen_->id != g || !gen_->warming) return;
      gen = gen_.get();
    }
    const Deadline deadline = Clock::now() + options_.timeout;
    auto st = with_context(gen->group->wait_ready(deadline),
                           fmt::format("nccl group {}: waiting for {} ranks to join", g, gen->world_size));
    if (st) st = gen->group->warmup(deadline);
    std::lock_guard l(mu_);
    gen->warming = false;
    gen->ready = bool(st);
    if (!st) kill(*gen, st.error().what());
    cv_.notify_all();
  }

  // Under mu_: `gen` is gone (aborted, failed or replaced); members still waiting are answered.
  void kill(Generation& gen, const std::string& why) {
    if (gen.dead.empty()) gen.dead = why;
    if (gen.group) gen.group->abort(gen.dead);
    for (const auto& [key, count] : wants_) {
      if (key.first != gen.id || served_.count(key)) continue;
      served_.insert(key);
      answers_.push_back({sent_key(key.first, key.second),
                          json{{"error", fmt::format("group {} is gone: {}", gen.id, gen.dead)}}.dump()});
    }
    ARLO_WARN("weight_sync nccl: group {} gone: {}", gen.id, gen.dead);
    cv_.notify_all();
  }

  Status parse_members(const json& request, Generation& gen) {
    if (!request.is_object() || !request.contains("members") || !request["members"].is_array() ||
        request["members"].empty())
      return make_error(ErrorCode::kInvalidArgument,
                        "nccl group request: expected {\"members\": [{name, world_size, flavor}, ...]}");
    bool vllm = false, sglang = false, arlo = false;
    gen.world_size = 1;
    for (const auto& m : request["members"]) {
      GroupMember member;
      if (!m.is_object() || !m.contains("name") || !m["name"].is_string())
        return make_error(ErrorCode::kInvalidArgument, "nccl group request: a member without a name");
      member.name = m["name"].get<std::string>();
      member.world_size = m.value("world_size", 1);
      member.flavor = m.value("flavor", "arlo");
      if (member.world_size < 1)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("nccl group: member {} has world size {}", member.name, member.world_size));
      if (member.flavor == "vllm")
        vllm = true;
      else if (member.flavor == "sglang")
        sglang = true;
      else if (member.flavor == "arlo")
        arlo = true;
      else
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("nccl group: member {} has flavor '{}': use vllm, sglang or arlo", member.name, member.flavor));
      gen.world_size += member.world_size;
      gen.members.push_back(std::move(member));
    }
    if (vllm && sglang)
      return make_error(
          ErrorCode::kInvalidArgument,
          "nccl group: vLLM and SGLang servers cannot share one group (vLLM's workers issue a warm-up "
          "all-reduce after init, SGLang's do not); run them with separate trainers or one kind of server");
    gen.warmup = vllm;
    gen.checksum = arlo;
    gen.layout.packed = sglang ? false : params_.at("packed").get<bool>();
    gen.layout.packed_buffer_bytes = params_.at("packed_buffer_bytes").get<std::uint64_t>();
    gen.layout.packed_num_buffers = params_.at("packed_num_buffers").get<int>();
    return ok();
  }

  // The rendezvous store, the id under every key a member flavor reads, and rank 0's non-blocking
  // init. Returns the join fields members share.
  Result<json> start_group(Generation& gen) {
    ARLO_ASSIGN_OR_RETURN(gen.rendezvous, StoreServer::start(host_, 0));
    ARLO_ASSIGN_OR_RETURN(auto id, new_unique_id(library_));
    // One name per generation: torch refuses to create a process group under a name it has seen.
    const std::string group_name = fmt::format("{}-g{}", params_.at("group_name").get<std::string>(), gen.id);
    const std::string raw(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
    gen.rendezvous->set(std::string(kVllmUniqueIdKey), vllm_unique_id_pickle(id));
    gen.rendezvous->set(sglang_unique_id_key(group_name), raw);
    // Older SGLang builds its group on PrefixStore(init_method): "/tcp://host:port/<group>//cuda//0".
    gen.rendezvous->set(fmt::format("/tcp://{}:{}/{}//cuda//0", master_, gen.rendezvous->port(), group_name), raw);
    gen.rendezvous->set(std::string(kArloUniqueIdKey), raw);
    GroupConfig config;
    config.library_path = library_;
    config.world_size = gen.world_size;
    config.rank = 0;
    config.device = params_.at("device").get<int>();
    config.collective_timeout = options_.bucket_timeout;
    ARLO_ASSIGN_OR_RETURN(gen.group, Group::start(config, id));
    return json{{"generation", gen.id},
                {"master_address", master_},
                {"master_port", gen.rendezvous->port()},
                {"world_size", gen.world_size},
                {"group_name", group_name},
                {"nccl_unique_id_b64", base64(id)},
                {"nccl_version", nccl_version_},
                {"packed", gen.layout.packed},
                {"packed_buffer_size_bytes", gen.layout.packed_buffer_bytes},
                {"packed_num_buffers", gen.layout.packed_num_buffers},
                {"warmup", gen.warmup}};
  }

  // Init (first transfer), warm-up (vLLM), then the broadcast; all under the version's deadline.
  Result<PublishReport> transfer(Generation& g, Version version, const WeightSource& source) {
    const auto start = Clock::now();
    const Deadline deadline = start + options_.timeout;
    auto cancelled = [this, &g] {
      std::lock_guard l(mu_);
      return stop_ || !g.dead.empty();
    };
    if (!g.ready) {  // SGLang's ranks init lazily, in their first broadcast
      ARLO_TRY(with_context(g.group->wait_ready(deadline),
                            fmt::format("nccl group {}: waiting for {} ranks to join", g.id, g.world_size)));
      g.ready = true;
    }
    ARLO_ASSIGN_OR_RETURN(auto sent, g.group->send(source, g.layout, deadline, cancelled));
    PublishReport r;
    r.version = version;
    r.payload = PayloadKind::kFull;
    for (const auto& s : source.specs()) r.raw_bytes += s.nbytes();
    r.wire_bytes = sent.bytes;
    r.buckets = sent.collectives;
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    for (const auto& m : g.members) r.peers.push_back({m.name, true, "", sent.bytes});
    return r;
  }

  const Options options_;
  const json params_;
  std::unique_ptr<StoreServer> control_;
  const std::string host_;    // where the stores listen
  const std::string master_;  // where members reach them
  const std::string library_;
  const std::string nccl_version_;
  std::thread control_thread_;

  // The staging publisher's server thread only:
  bool tensors_set_ = false;
  std::vector<TensorSpec> specs_;
  std::optional<Version> newest_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::unique_ptr<Generation> gen_;
  std::vector<std::unique_ptr<Generation>> old_;
  std::deque<std::pair<std::int64_t, std::string>> requests_;
  std::vector<std::pair<std::string, std::string>> answers_;
  std::map<std::pair<std::int64_t, Version>, std::int64_t> wants_;
  std::set<std::pair<std::int64_t, Version>> served_;
};

// ---------------------------------------------------------------------------------------------
// The orchestrator's control (collective.h) and arlo's own receiver (rank > 0).

class Control final : public CollectiveControl {
 public:
  explicit Control(HostPort at) : at_(std::move(at)) {}

  Result<GroupInfo> open_group(const std::vector<GroupMember>& members, Deadline deadline) override {
    ARLO_ASSIGN_OR_RETURN(auto c, client(deadline));
    json request = {{"members", json::array()}};
    for (const auto& m : members)
      request["members"].push_back({{"name", m.name}, {"world_size", m.world_size}, {"flavor", m.flavor}});
    ARLO_ASSIGN_OR_RETURN(auto g, c->add(std::string(kGenerationKey), 1, deadline));
    ARLO_TRY(c->set(group_key(g, "request"), request.dump(), deadline));
    ARLO_ASSIGN_OR_RETURN(auto text, c->get(group_key(g, "ready"), deadline));
    ARLO_ASSIGN_OR_RETURN(auto ready, parse_json_value(text, group_key(g, "ready")));
    if (ready.contains("error"))
      return make_error(ErrorCode::kUnavailable, fmt::format("nccl publisher at {}:{} refused group {}: {}", at_.host,
                                                             at_.port, g, ready["error"].get<std::string>()));
    GroupInfo info;
    info.generation = g;
    for (const auto& [name, join] : ready.at("members").items()) info.join[name] = join;
    return info;
  }

  Result<json> tensors(Deadline deadline) override {
    ARLO_ASSIGN_OR_RETURN(auto c, client(deadline));
    ARLO_ASSIGN_OR_RETURN(auto text, c->get(std::string(kTensorsKey), deadline));
    return parse_json_value(text, kTensorsKey);
  }

  Result<Version> receiving(std::int64_t generation, Version version, Deadline deadline) override {
    ARLO_ASSIGN_OR_RETURN(auto c, client(deadline));
    return receive_turn(*c, generation, version, deadline);
  }

  Status abort(std::int64_t generation, const std::string& why, Deadline deadline) override {
    ARLO_ASSIGN_OR_RETURN(auto c, client(deadline));
    return c->set(group_key(generation, "abort"), why, deadline);
  }

  // Counts this member in for `version` and waits for the publisher's answer.
  static Result<Version> receive_turn(StoreClient& c, std::int64_t generation, Version version, Deadline deadline) {
    ARLO_TRY(c.add(want_key(generation, version), 1, deadline));
    ARLO_ASSIGN_OR_RETURN(auto text, c.get(sent_key(generation, version), deadline));
    ARLO_ASSIGN_OR_RETURN(auto sent, parse_json_value(text, sent_key(generation, version)));
    if (sent.contains("error"))
      return make_error(ErrorCode::kUnavailable,
                        fmt::format("nccl: v{} not sent: {}", version, sent["error"].get<std::string>()));
    return version_from_json(sent.at("version"), fmt::format("nccl control key {}", sent_key(generation, version)));
  }

  Result<std::unique_ptr<StoreClient>> client(Deadline deadline) const {
    auto c = StoreClient::connect(at_.host, at_.port, deadline);
    if (!c)
      return std::unexpected(
          std::move(c).error().with_context(fmt::format("nccl control store {}:{}", at_.host, at_.port)));
    return c;
  }

 private:
  HostPort at_;
};

class NcclReceiver final : public ReceiverTransport {
 public:
  static Result<std::unique_ptr<ReceiverTransport>> create(const ReceiverState& s) {
    default_nccl_environment();
    const auto& p = s.params;
    ARLO_ASSIGN_OR_RETURN(auto at, split_host_port(p.at("address").get<std::string>(), "address"));
    if (at.port == 0)
      return make_error(ErrorCode::kInvalidArgument, "nccl receiver: address needs the publisher's port");
    const std::string member =
        p.at("member").get<std::string>().empty() ? s.options.peer_name : p.at("member").get<std::string>();
    if (member.empty())
      return make_error(ErrorCode::kInvalidArgument,
                        "nccl receiver: name the group member (weight_sync params member, or peer_name)");
    ARLO_ASSIGN_OR_RETURN(auto version, library_version(p.at("nccl_library").get<std::string>()));
    return std::unique_ptr<ReceiverTransport>(new NcclReceiver(s, std::move(at), member, std::move(version)));
  }

  Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) override {
    const auto start = Clock::now();
    Control control(at_);
    ARLO_ASSIGN_OR_RETURN(auto c, control.client(deadline));
    ARLO_ASSIGN_OR_RETURN(auto join_text, c->get(member_key(member_), deadline));
    ARLO_ASSIGN_OR_RETURN(auto join, parse_json_value(join_text, member_key(member_)));
    const auto theirs = join.value("nccl_version", "");
    if (theirs != nccl_version_)
      return make_error(
          ErrorCode::kMismatch,
          fmt::format("nccl: the publisher runs NCCL {}, this receiver loaded NCCL {} ({}); NCCL refuses mixed "
                      "versions: load the same libnccl on both sides (weight_sync.nccl_library)",
                      theirs, nccl_version_, state.params.at("nccl_library").get<std::string>()));
    ARLO_ASSIGN_OR_RETURN(auto tensors_text, c->get(std::string(kTensorsKey), deadline));
    ARLO_ASSIGN_OR_RETURN(auto tensors, parse_json_value(tensors_text, kTensorsKey));
    ARLO_ASSIGN_OR_RETURN(auto specs, specs_from_json(tensors));
    for (const auto& spec : specs) {  // the sink refuses up front, before any collective
      auto buf = sink.buffer_for(spec);
      if (!buf)
        return std::unexpected(std::move(buf).error().with_context(fmt::format("nccl: tensor '{}'", spec.name)));
      if (buf->size() != spec.nbytes())
        return make_error(ErrorCode::kMismatch,
                          fmt::format("nccl: tensor '{}': the sink holds {} bytes, the publisher sends {}", spec.name,
                                      buf->size(), spec.nbytes()));
    }
    const std::int64_t generation = join.at("generation").get<std::int64_t>();
    if (!group_ || generation_ != generation || group_->aborted()) ARLO_TRY(join_group(join, state, deadline));
    ARLO_ASSIGN_OR_RETURN(auto newest_text, c->get(std::string(kNewestKey), deadline));
    ARLO_ASSIGN_OR_RETURN(const Version want,
                          version_from_text(newest_text, fmt::format("nccl control key {}", kNewestKey)));
    ARLO_TRY(c->add(want_key(generation, want), 1, deadline));
    auto got = group_->receive(sink, specs, layout_of(join), deadline);
    if (!got) {
      (void)c->set(group_key(generation, "abort"), std::string("receiver ") + member_ + ": " + got.error().what(),
                   deadline);
      if (state.options.apply_mode == ApplyMode::kInPlace) {
        sink.discard(want, got.error());
        state.version.reset();
      }
      return std::unexpected(std::move(got).error());
    }
    ARLO_ASSIGN_OR_RETURN(auto sent_text, c->get(sent_key(generation, want), deadline));
    ARLO_ASSIGN_OR_RETURN(auto sent, parse_json_value(sent_text, sent_key(generation, want)));
    if (sent.contains("error"))
      return make_error(ErrorCode::kUnavailable,
                        fmt::format("nccl: v{} not sent: {}", want, sent["error"].get<std::string>()));
    ARLO_ASSIGN_OR_RETURN(
        const Version version,
        version_from_json(sent.at("version"), fmt::format("nccl control key {}", sent_key(generation, want))));
    if (sent.contains("checksum") && sink.device().is_cpu()) {
      ARLO_ASSIGN_OR_RETURN(auto sum, weights_checksum(SinkView(sink, specs)));
      if (checksum_hex(sum) != sent["checksum"].get<std::string>()) {
        sink.discard(version, Error(ErrorCode::kMismatch, "checksum"));
        state.version.reset();
        return make_error(ErrorCode::kMismatch,
                          fmt::format("nccl: v{} arrived with checksum {}, the publisher sent {}", version,
                                      checksum_hex(sum), sent["checksum"].get<std::string>()));
      }
    }
    ARLO_TRY(sink.commit(version));
    state.version = version;
    state.specs = specs;
    ReceiveReport r;
    r.version = version;
    r.payload = PayloadKind::kFull;
    r.wire_bytes = got->bytes;
    r.buckets = got->collectives;
    r.path = "nccl";
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }

 private:
  NcclReceiver(const ReceiverState& s, HostPort at, std::string member, std::string version)
      : at_(std::move(at)), member_(std::move(member)), nccl_version_(std::move(version)) {
    (void)s;
  }

  Status join_group(const json& join, const ReceiverState& state, Deadline deadline) {
    group_.reset();
    const auto master = join.at("master_address").get<std::string>();
    const auto port = join.at("master_port").get<std::uint16_t>();
    auto store = StoreClient::connect(master, port, deadline);
    if (!store)
      return std::unexpected(std::move(store).error().with_context(fmt::format("nccl rendezvous {}:{}", master, port)));
    ARLO_ASSIGN_OR_RETURN(auto raw, (*store)->get(std::string(kArloUniqueIdKey), deadline));
    if (raw.size() != UniqueId{}.bytes.size())
      return make_error(ErrorCode::kParse, fmt::format("nccl rendezvous {}:{}: the unique id has {} bytes, not 128",
                                                       master, port, raw.size()));
    UniqueId id;
    std::memcpy(id.bytes.data(), raw.data(), raw.size());
    GroupConfig config;
    config.library_path = state.params.at("nccl_library").get<std::string>();
    config.world_size = join.at("world_size").get<int>();
    config.rank = join.at("rank_offset").get<int>();
    config.device = state.params.at("device").get<int>();
    config.collective_timeout = state.options.bucket_timeout;
    ARLO_ASSIGN_OR_RETURN(group_, Group::start(config, id));
    ARLO_TRY(group_->wait_ready(deadline));
    if (join.value("warmup", false)) ARLO_TRY(group_->warmup(deadline));
    generation_ = join.at("generation").get<std::int64_t>();
    return ok();
  }

  HostPort at_;
  std::string member_;
  std::string nccl_version_;
  std::unique_ptr<Group> group_;
  std::int64_t generation_ = -1;
};

}  // namespace
}  // namespace nccl

TransportDescriptor nccl_transport() {
  TransportDescriptor d;
  d.name = "nccl";
  d.doc =
      "GPU broadcast from trainer rank 0 to every worker GPU (vLLM, SGLang or arlo receivers), libnccl loaded at run "
      "time";
  d.capabilities.collective = true;
  d.capabilities.devices = {Device::Kind::kCpu, Device::Kind::kCuda};
  d.options = {
      string_option(
          "address", "127.0.0.1:0",
          "publisher: where its control store listens (port 0: any free port; announced); receiver: the publisher's")
          .user_key(),
      string_option("master_address", "",
                    "publisher: the address members reach its stores on (empty: the host of address)")
          .user_key(),
      string_option("nccl_library", "/usr/local/cuda/lib64/libnccl.so.2",
                    "libnccl to load; the same NCCL version as the servers' torch (NCCL refuses mixed versions)")
          .user_key()
          .is_path(),
      int_option("device", 0, "CUDA device of this side's rank (cudaSetDevice before init)").range(0, 1024).user_key(),
      bool_option("packed", true,
                  "vLLM members: packed uint8 buckets (false: one broadcast per tensor); SGLang: per tensor")
          .user_key(),
      int_option("packed_buffer_bytes", 1ll << 30,
                 "packed layout: a bucket closes after the tensor that crosses this size")
          .range(1, 1ll << 40)
          .user_key(),
      int_option("packed_num_buffers", 2, "packed layout: device buffers (and streams) that overlap")
          .range(1, 8)
          .user_key(),
      string_option("group_name", "weight_update_group",
                    "SGLang: the process group's name, suffixed -g<generation> per group (its id key derives from it)")
          .user_key(),
      string_option("member", "", "receiver: its member name in the group (empty: peer_name)"),
      string_option("nccl_version", "", "announced: the publisher's NCCL version (receivers load the same one)"),
  };
  d.sender = &nccl::NcclSender::create;
  d.receiver = &nccl::NcclReceiver::create;
  d.control = [](const nlohmann::json& endpoint, Deadline) -> Result<std::unique_ptr<CollectiveControl>> {
    if (!endpoint.is_object() || !endpoint.contains("address") || !endpoint["address"].is_string())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("nccl endpoint {}: needs \"address\"", endpoint.dump()));
    ARLO_ASSIGN_OR_RETURN(auto at, nccl::split_host_port(endpoint["address"].get<std::string>(), "endpoint address"));
    return std::unique_ptr<CollectiveControl>(new nccl::Control(std::move(at)));
  };
  return d;
}

}  // namespace arlo::weight_sync
