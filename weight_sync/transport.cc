#include "weight_sync/transport.h"

#include <map>
#include <mutex>

namespace arlo::weight_sync {

// Defined by each built-in transport (transports/*.cc).
Result<std::unique_ptr<SenderTransport>> make_tcp_sender(const Options&);
Result<std::unique_ptr<ReceiverTransport>> make_tcp_receiver(const Options&);
Result<std::unique_ptr<SenderTransport>> make_shm_sender(const Options&);
Result<std::unique_ptr<ReceiverTransport>> make_shm_receiver(const Options&);
Result<std::unique_ptr<SenderTransport>> make_fs_sender(const Options&);
Result<std::unique_ptr<ReceiverTransport>> make_fs_receiver(const Options&);

namespace {

struct Entry {
  SenderFactory sender;
  ReceiverFactory receiver;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Entry> entries;
  Registry() {
    entries["tcp"] = {make_tcp_sender, make_tcp_receiver};
    entries["shm"] = {make_shm_sender, make_shm_receiver};
    entries["filesystem"] = {make_fs_sender, make_fs_receiver};
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

Result<Entry> find(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.entries.find(name);
  if (it == r.entries.end()) {
    std::string known;
    for (const auto& [k, v] : r.entries) known += (known.empty() ? "" : " | ") + k;
    return make_error(ErrorCode::kInvalidArgument,
                      "weight_sync.transport = '" + name + "' is not available; known: " + known);
  }
  return it->second;
}

}  // namespace

Result<std::unique_ptr<SenderTransport>> make_sender_transport(const Options& options) {
  ARLO_ASSIGN_OR_RETURN(auto e, find(options.transport));
  return e.sender(options);
}

Result<std::unique_ptr<ReceiverTransport>> make_receiver_transport(const Options& options) {
  ARLO_ASSIGN_OR_RETURN(auto e, find(options.transport));
  return e.receiver(options);
}

}  // namespace arlo::weight_sync
