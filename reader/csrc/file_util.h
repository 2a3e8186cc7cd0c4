// Whole-file reads of the store's small side files (CHECKPOINT, BLOCKSUMS).
#pragma once
#include <cstddef>
#include <string>

namespace recflash {

// The whole file into *out, by its size in one read (an istreambuf_iterator copy went a byte
// at a time: 20 % of a 2 M-row store's open, for its 4.5 MB checkpoint). False if the file is
// absent or cannot be read; *out is then empty.
bool ReadWholeFile(const std::string& path, std::string* out);
// The first n bytes of the file into out. False if the file is absent, shorter or unreadable.
bool ReadFilePrefix(const std::string& path, void* out, size_t n);

}  // namespace recflash
