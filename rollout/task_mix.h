#pragma once
// Several task sources in one run (env.sources), served in a fixed ratio that holds exactly over
// time, with one cursor for all of them.
//
// Each source is a TaskStream of its own (seeded shuffle, epochs, cursor). The mix picks the next
// source by largest deficit: after n tasks, source i should have served n * r_i / sum(r) of them; the
// next task comes from the source furthest below its share (ties: the first listed). So after any n
// tasks every source is within one task of its exact share, the pattern is deterministic (1:1 is
// a, b, a, b, ...; 2:1 is a, b, a, a, b, a, ...), and the pick needs no state but the counts served,
// which the cursor keeps with every source's own cursor: a resumed run continues the same pattern
// with the same tasks. A source whose stream is exhausted (epochs served) is left out of the
// picks from then on.
//
// With several sources each task's `env` is its source's name: eval and metrics report per env
// name, and reward modules can be chosen by it (session/rollout_parts.cc). A mix of one source
// (the single env.kind) leaves tasks as its stream made them and its cursor is the stream's own,
// so checkpoints of single-source runs are what they were.
//
// Thread-safety: used by one thread (the orchestrator's event loop), like TaskStream.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "rollout/environment.h"

namespace arlo::rollout {

class TaskMix {
 public:
  struct Source {
    std::string name;  // the tasks' env name; unique within the mix
    std::shared_ptr<TaskStream> stream;
    double ratio = 1.0;  // > 0; only the ratios between sources matter
  };

  // A mix of one stream: its tasks and cursor as they are.
  explicit TaskMix(std::shared_ptr<TaskStream> single);
  // kInvalidArgument when there is no source, a ratio is not a positive finite number, a stream is
  // missing or two sources share a name.
  static Result<std::shared_ptr<TaskMix>> make(std::vector<Source> sources);

  // The next task, from the source the ratio says; kNotFound once every source is exhausted.
  Result<Task> next();
  bool exhausted() const;

  const std::vector<Source>& sources() const { return sources_; }
  // Tasks served by each source, in the order of sources().
  const std::vector<std::uint64_t>& served() const { return served_; }

  // One source: that stream's cursor. Several: {"mix": [{"name", "ratio", "served", "stream"}, ...]}.
  Json cursor() const;
  // Continues from a saved cursor. kMismatch when it was saved for other sources (names, ratios,
  // or any stream's own check), kParse when it is malformed.
  Status restore(const Json& cursor);

 private:
  TaskMix() = default;
  // The index of the source the next task comes from, or -1 when all are exhausted.
  int pick() const;

  std::vector<Source> sources_;
  std::vector<std::uint64_t> served_;
  bool single_ = false;
};

}  // namespace arlo::rollout
