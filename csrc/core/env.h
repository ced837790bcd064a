// Environment variables and on-disk locations shared by the runtime and the dispatcher.
#pragma once

#include <optional>
#include <string>

namespace primus_turbo {

// The variable's value, or nullopt when unset or only white space.
std::optional<std::string> env_value(const char* name);

// Root of every on-disk cache: $PRIMUS_TURBO_CACHE_DIR, else $XDG_CACHE_HOME/primus_turbo, else
// ~/.cache/primus_turbo. Created on demand.
std::string cache_root();

// mkdir -p; throws with the path and errno text on failure.
void make_dirs(const std::string& path);

std::string to_upper(std::string s);
std::string trim(const std::string& s);

// A name part unique across processes and threads, for temporary files and directories.
std::string unique_suffix();

// Writes data to path atomically: a uniquely named temporary file in the same directory, fsync,
// then rename over path. Readers see the old or the new file, never a torn one.
void write_file_atomic(const std::string& path, const std::string& data);
// Returns false when the file does not exist.
bool read_file(const std::string& path, std::string* data);

}  // namespace primus_turbo
