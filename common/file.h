#pragma once
// Files written whole or not at all: the one atomic-write helper every module uses (checkpoints,
// summaries, weight-sync markers, bridge acks and versions, trainer state, generated docs).
#include <filesystem>
#include <string_view>

#include "common/result.h"

namespace arlo {

// Writes `contents` to `path` so that a reader, or a crash, sees the previous file or the new one,
// never part of one: a temporary file in the same directory (".<name>.tmp.<pid>.<n>", hidden and
// unique per call, so concurrent writers never share one), fsync, rename over `path`, fsync of the
// directory. Creates missing parent directories. On failure the temporary file is removed, `path`
// is left as it was, and the error names the file and the step that failed.
Status write_file_atomically(const std::filesystem::path& path, std::string_view contents);

// For a file of lines that is appended to (a .jsonl log): drops a last line without its newline,
// what a full disk or a kill mid-write leaves, so the next append starts a line of its own. No file,
// or one that ends in a newline, is left as it is.
Status drop_partial_last_line(const std::filesystem::path& path);

}  // namespace arlo
