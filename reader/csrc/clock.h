// The engine's clock for timings it reports (read and recovery seconds, time blocked on the
// device): monotonic, in seconds.
#pragma once
#include <chrono>

namespace recflash {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace recflash
