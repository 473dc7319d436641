// StagingSubscriber and HeldVersion (subscriber.h).
#include "weight_sync/subscriber.h"

#include <algorithm>

#include <fmt/format.h>

namespace arlo::weight_sync {

void HeldVersion::begin() {
  asked_.clear();
  fresh_.clear();
}

Result<std::span<std::byte>> HeldVersion::buffer_for(const TensorSpec& spec) {
  if (std::find(asked_.begin(), asked_.end(), spec.name) == asked_.end()) asked_.push_back(spec.name);
  auto held = held_.find(spec.name);
  if (held != held_.end() && held->second.spec == spec)
    return std::span<std::byte>(held->second.data.get(), spec.nbytes());
  auto& f = fresh_[spec.name];
  if (!f.data || f.spec != spec)
    f = Buffer{spec, std::make_unique<std::byte[]>(std::max<std::uint64_t>(spec.nbytes(), 1))};
  return std::span<std::byte>(f.data.get(), spec.nbytes());
}

Status HeldVersion::commit(Version) {
  for (auto& [name, f] : fresh_) held_[name] = std::move(f);
  fresh_.clear();
  std::erase_if(held_,
                [&](const auto& kv) { return std::find(asked_.begin(), asked_.end(), kv.first) == asked_.end(); });
  specs_.clear();
  for (const auto& name : asked_) specs_.push_back(held_.at(name).spec);
  return ok();
}

Result<TensorView> HeldVersion::view(std::size_t index) const {
  if (index >= specs_.size())
    return make_error(ErrorCode::kNotFound, fmt::format("tensor index {} out of range", index));
  const auto& spec = specs_[index];
  return TensorView{&spec, {held_.at(spec.name).data.get(), static_cast<std::size_t>(spec.nbytes())}, Device::cpu()};
}

StagingSubscriber::StagingSubscriber(Options own) : own_(std::move(own)) {}
StagingSubscriber::~StagingSubscriber() = default;

Result<Options> StagingSubscriber::options_for(const nlohmann::json& block) const {
  return options_from_json(block, own_);
}

Result<Options> StagingSubscriber::options_for(const Announcement& announcement) const {
  return options_for(receiver_block(announcement));
}

Status StagingSubscriber::use(const Options& options) {
  std::string key = to_json(options).dump();
  if (subscriber_ && key == key_) return ok();
  subscriber_.reset();
  key_.clear();
  ARLO_ASSIGN_OR_RETURN(subscriber_, Subscriber::create(options));
  subscriber_->assume_version(assumed_);
  key_ = std::move(key);
  return ok();
}

Result<Pulled> StagingSubscriber::pull(Deadline deadline) {
  held_.begin();
  return pull(held_, held_, deadline);
}

Result<Pulled> StagingSubscriber::pull(WeightSink& sink, const WeightSource& held, Deadline deadline) {
  if (!subscriber_) return make_error(ErrorCode::kUnavailable, "weight_sync: no transport to pull from (use() failed)");
  auto got = subscriber_->receive(sink, deadline);
  assumed_ = subscriber_->version();
  if (!got) return std::unexpected(got.error());
  ARLO_ASSIGN_OR_RETURN(auto sum, weights_checksum(held));
  return Pulled{*got, sum};
}

nlohmann::json StagingSubscriber::relay_endpoint() const {
  return subscriber_ ? subscriber_->relay_endpoint() : nlohmann::json::object();
}

nlohmann::json to_json(const Pulled& p) {
  const ReceiveReport& r = p.report;
  nlohmann::json j = nlohmann::json::object();
  j["version"] = r.version;
  j["payload"] = to_string(r.payload);
  j["wire_bytes"] = r.wire_bytes;
  j["buckets"] = r.buckets;
  j["retried_buckets"] = r.retried_buckets;
  j["path"] = r.path;
  j["seconds"] = r.seconds;
  j["checksum"] = checksum_hex(p.checksum);
  return j;
}

}  // namespace arlo::weight_sync
