// VersionSet: the store's current view (which pages hold each feature's valid items), the
// readers registered on views, and the pages a flush or merge dropped from the view while
// readers of older views may still read them (the LevelDB db/version_set.h idea).
//
// A Version is immutable once built. The writer builds the next one after committing its
// metadata and installs it; a reader takes the current one and registers its number, reads
// without locks, and unregisters. A page dropped by version N becomes reusable only when no
// reader is registered on a version below N, so a scan always sees one consistent state.
//
// Locking: every member is guarded by the mutex given at construction, which is the Store's
// mu_ (readers take the view together with the buffered items under it, so both describe the
// same state). Functions ending in Locked need it held; the others take it.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "reader/csrc/metadata.h"
#include "reader/csrc/mutex.h"
#include "reader/csrc/thread_annotations.h"

namespace recflash {

// A page holding valid items of one feature, as a version sees it. (A read-only handle that
// has not built its key index counts every record of a non-retired segment as valid: reads
// stay exact because the newest seq wins per key, only direct placement needs disjoint pages.)
struct PageRef {
  uint32_t page;
  uint32_t count;
  uint32_t valid;
  uint32_t tombs;
  bool solo;  // the page holds only this feature's segment
  uint64_t seq;
  uint64_t min_key, max_key;
};

struct Version {
  uint64_t number = 0;
  std::vector<std::shared_ptr<const std::vector<PageRef>>> features;  // by feature id, ascending min_key

  // The pages of a feature (empty when it has none).
  const std::vector<PageRef>& refs(uint32_t fid) const;
  // Deferred-index feature (disjoint segments): the page whose segment's key range holds
  // `key`, or UINT32_MAX.
  uint32_t DeferredPage(uint32_t fid, uint64_t key) const;
};

// The version of the tables as they are now (the writer's FeatureTable and page table).
std::shared_ptr<const Version> BuildVersion(uint64_t number, FeatureTable& features, const LogicalPageTable& pages);

class VersionSet {
 public:
  explicit VersionSet(Mutex* mu) : mu_(mu) {}

  // Unregisters a reader when it goes out of scope.
  class Reader {
   public:
    Reader(VersionSet* vs, uint64_t number) : vs_(vs), number_(number) {}
    ~Reader() { vs_->Unregister(number_); }
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

   private:
    VersionSet* vs_;
    uint64_t number_;
  };

  // The current version. Needs mu_, or the writer's own lock: only the writer installs, and
  // it installs holding both. Unchecked, since the analysis cannot express "either lock".
  const std::shared_ptr<const Version>& current() const RF_NO_THREAD_SAFETY_ANALYSIS { return current_; }
  // The current version, registered for a reader (wrap the number in a Reader).
  std::shared_ptr<const Version> RegisterLocked() RF_REQUIRES(mu_);
  // Makes v current; `freed` pages (dropped by v) are pending until TakeReleasable.
  void InstallLocked(std::shared_ptr<const Version> v, const std::set<uint32_t>& freed = {}) RF_REQUIRES(mu_);
  // The Store holds its mu_, the mutex this set was built with: the analysis cannot see that
  // the two names are one lock, so the Store states it right after taking mu_.
  void AssertHeld() const RF_ASSERT_CAPABILITY(mu_) {}
  // Removes and returns (ascending) the pending pages no registered reader can still see.
  std::vector<uint32_t> TakeReleasable() RF_EXCLUDES(mu_);
  // Blocks until no reader is registered. Needs mu_.
  void WaitForNoReadersLocked() RF_REQUIRES(mu_);

 private:
  void Unregister(uint64_t number) RF_EXCLUDES(mu_);

  Mutex* const mu_;
  CondVar readers_cv_;
  std::shared_ptr<const Version> current_ RF_GUARDED_BY(mu_);
  std::multiset<uint64_t> readers_ RF_GUARDED_BY(mu_);  // registered version numbers
  std::vector<std::pair<uint64_t, uint32_t>> pending_free_ RF_GUARDED_BY(mu_);  // (version that dropped it, page)
};

}  // namespace recflash
