// Remembers autotune winners: in memory, and on disk so a new process (or another rank) reuses
// them. Keys are built by the binding and already name the GPU; the file name carries the
// library version, so an upgrade starts afresh instead of trusting old timings.
//
// File format: one "key<TAB>value<TAB>checksum" line per entry. A line whose checksum does not
// match (a torn write, a hand edit) is ignored and dropped at the next store.
#pragma once

#include <optional>
#include <string>

namespace primus_turbo::autotune {

std::optional<std::string> lookup(const std::string& key);
void store(const std::string& key, const std::string& value);
void clear(bool also_disk);
std::string cache_file();
// Entries rejected as corrupt when the file was last read (for tests).
int corrupt_lines_seen();

}  // namespace primus_turbo::autotune
