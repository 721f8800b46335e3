// lib/tiers/file_backend.cpp: the file:// storage tier. One file per page,
// root/<first byte>/<64 hex digits of the key>, holding the page as
// clm/tiers/page_file.hpp encodes it; written under a temporary name,
// fsync'ed and renamed, so a name always holds a whole page.
//
// The directory is the truth (several processes may share it); the in-memory
// index only orders pages by last use, for the size cap. It is rebuilt at
// open from the files' mtimes, which a read refreshes, so the order survives
// a restart. Processes that share a directory each enforce the cap on the
// pages they know of: the cap is approximate then.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/tiers/page_file.hpp"
#include "storage_backends.hpp"

namespace clm::tiers_detail {

namespace {

constexpr std::string_view kTempPrefix = ".tmp-";
// A temporary file this old was left by a writer that died; a younger one
// may belong to another process writing into the same directory right now.
constexpr std::time_t kStaleTempSeconds = 60;

struct PageKeyHash {
  std::size_t operator()(const PageKey& key) const {
    std::size_t h;
    std::memcpy(&h, key.bytes.data(), sizeof h);  // SHA-256 bytes: already uniform
    return h;
  }
};

class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  // close(2)'s own result: on some file systems the last write error shows here.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

bool is_hex_name(std::string_view name, std::size_t length) {
  return name.size() == length &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool parse_key_hex(std::string_view hex, PageKey& key) {
  if (!is_hex_name(hex, 64)) return false;
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i < key.bytes.size(); ++i) {
    key.bytes[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  }
  return true;
}

// Reads exactly `size` bytes at `offset`; false with errno set (0 for a file
// shorter than that).
bool pread_full(int fd, void* data, std::size_t size, off_t offset) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
    offset += n;
  }
  return true;
}

bool write_full(int fd, std::span<const std::byte> header, std::span<const std::byte> payload) {
  iovec iov[2] = {{const_cast<std::byte*>(header.data()), header.size()},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  int first = 0;
  while (first < 2) {
    const ssize_t n = ::writev(fd, iov + first, 2 - first);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    auto left = static_cast<std::size_t>(n);
    while (first < 2 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

enum class ReadOutcome { found, missing, corrupt, failed };

class FileBackend final : public StorageBackend {
 public:
  FileBackend(std::string url, std::string root, const PageLayout& layout, const PageSeal& seal,
              std::uint64_t capacity_bytes)
      : url_(std::move(url)),
        root_(std::move(root)),
        layout_(layout),
        seal_(seal),
        page_bytes_(layout.page_bytes()),
        file_bytes_(kPageHeaderSize + layout.page_bytes()),
        capacity_bytes_(capacity_bytes) {}

  Status open() {
    std::error_code ec;
    std::filesystem::create_directories(root_, ec);
    if (ec) return io_error(fmt::format("file storage: cannot create directory {}: {}", root_, ec.message()));
    if (!std::filesystem::is_directory(root_, ec)) {
      return io_error(fmt::format("file storage: {} is not a directory", root_));
    }
    // Writable? A probe file says it where permission bits would not (root,
    // read-only mounts, ACLs).
    const std::string probe = fmt::format("{}/{}probe-{}", root_, kTempPrefix, ::getpid());
    UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return io_error(fmt::format("file storage: directory {} is not writable: {}", root_, std::strerror(errno)));
    }
    fd.close();
    ::unlink(probe.c_str());
    scan();
    std::vector<PageKey> victims;
    {
      std::lock_guard lock(mu_);
      collect_victims(victims);
    }
    remove_victims(victims);
    return {};
  }

  Status exists(std::span<const PageKey> keys, std::span<std::uint8_t> found) override {
    CLM_RETURN_IF_ERROR(check_batch("file storage exists", keys.size(), found.size(), keys.size()));
    counters_.pages_checked.fetch_add(keys.size(), std::memory_order_relaxed);
    return guard_alloc("file storage exists", [&]() -> Status {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        struct stat st;
        const bool there = ::stat(page_path(keys[i]).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                           static_cast<std::size_t>(st.st_size) == file_bytes_;
        found[i] = there ? 1 : 0;
        if (!there) counters_.pages_missing.fetch_add(1, std::memory_order_relaxed);
      }
      return {};
    });
  }

  Status get_pages(std::span<const PageKey> keys, std::span<std::byte* const> pages,
                   std::span<std::uint8_t> found) override {
    CLM_RETURN_IF_ERROR(check_batch("file storage get", keys.size(), found.size(), pages.size()));
    return guard_alloc("file storage get", [&]() -> Status {
      std::vector<PageKey> victims;
      bool failed = false;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        PageFault fault = PageFault::none;
        const ReadOutcome r = read_page(keys[i], std::span(pages[i], page_bytes_), fault);
        found[i] = r == ReadOutcome::found ? 1 : 0;
        switch (r) {
          case ReadOutcome::found: {
            counters_.pages_read.fetch_add(1, std::memory_order_relaxed);
            counters_.bytes_read.fetch_add(page_bytes_, std::memory_order_relaxed);
            std::lock_guard lock(mu_);
            touch(keys[i]);
            collect_victims(victims);
            break;
          }
          case ReadOutcome::missing:
            counters_.pages_missing.fetch_add(1, std::memory_order_relaxed);
            break;
          case ReadOutcome::corrupt:
            counters_.count_refusal(fault);
            break;
          case ReadOutcome::failed:
            failed = true;
            break;
        }
        if (r != ReadOutcome::found) forget(keys[i]);
      }
      if (failed) counters_.errors.fetch_add(1, std::memory_order_relaxed);
      remove_victims(victims);
      return {};
    });
  }

  Status set_pages(std::span<const PageKey> keys, std::span<const std::byte* const> pages,
                   std::span<std::uint8_t> written) override {
    CLM_RETURN_IF_ERROR(check_batch("file storage set", keys.size(), written.size(), pages.size()));
    return guard_alloc("file storage set", [&]() -> Status {
      std::vector<PageKey> victims;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const bool ok = write_page(keys[i], std::span(pages[i], page_bytes_));
        written[i] = ok ? 1 : 0;
        if (!ok) {
          counters_.dropped_writes.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        counters_.pages_written.fetch_add(1, std::memory_order_relaxed);
        counters_.bytes_written.fetch_add(page_bytes_, std::memory_order_relaxed);
        std::lock_guard lock(mu_);
        touch(keys[i]);
        collect_victims(victims);
      }
      remove_victims(victims);
      return {};
    });
  }

  const PageLayout& layout() const override { return layout_; }
  const PageSeal& seal() const override { return seal_; }
  StorageStats stats() const override { return counters_.load(); }
  const std::string& url() const override { return url_; }

 private:
  std::string subdir_path(std::uint8_t first) const { return fmt::format("{}/{:02x}", root_, first); }
  std::string page_path(const PageKey& key) const {
    const std::string hex = key.hex();
    return fmt::format("{}/{}/{}", root_, std::string_view(hex).substr(0, 2), hex);
  }

  // The index from the files: page files of this layout's size, oldest
  // first; stale temporary files removed; anything else left alone.
  void scan() {
    struct Found {
      PageKey key;
      timespec mtime;
    };
    std::vector<Found> pages;
    remove_stale_temps(root_);
    for (int b = 0; b < 256; ++b) {
      const std::string dir = subdir_path(static_cast<std::uint8_t>(b));
      DIR* d = ::opendir(dir.c_str());
      if (!d) continue;
      subdir_ready_[static_cast<std::size_t>(b)].store(true, std::memory_order_relaxed);
      const std::string prefix = fmt::format("{:02x}", b);
      while (const dirent* e = ::readdir(d)) {
        const std::string_view name = e->d_name;
        PageKey key;
        struct stat st;
        if (name.starts_with(kTempPrefix)) {
          remove_if_stale(dir + "/" + std::string(name));
        } else if (name.starts_with(prefix) && parse_key_hex(name, key) &&
                   ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
                   static_cast<std::size_t>(st.st_size) == file_bytes_) {
          pages.push_back({key, st.st_mtim});
        }
      }
      ::closedir(d);
    }
    std::sort(pages.begin(), pages.end(), [](const Found& a, const Found& b) {
      return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
    });
    std::lock_guard lock(mu_);
    for (const Found& f : pages) touch(f.key);  // the newest ends at the front
  }

  void remove_stale_temps(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
      if (std::string_view(e->d_name).starts_with(kTempPrefix)) remove_if_stale(dir + "/" + e->d_name);
    }
    ::closedir(d);
  }

  static void remove_if_stale(const std::string& path) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        std::time(nullptr) - st.st_mtime > kStaleTempSeconds) {
      ::unlink(path.c_str());
    }
  }

  ReadOutcome read_page(const PageKey& key, std::span<std::byte> slot, PageFault& fault) {
    const std::string path = page_path(key);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return errno == ENOENT || errno == ENOTDIR ? ReadOutcome::missing : ReadOutcome::failed;
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ReadOutcome::failed;
    PageHeaderBytes header;
    fault = PageFault::damaged;
    bool intact = S_ISREG(st.st_mode) && static_cast<std::size_t>(st.st_size) == file_bytes_;
    if (intact && !pread_full(fd.get(), header.data(), header.size(), 0)) {
      if (errno != 0) return ReadOutcome::failed;
      intact = false;  // shrank since fstat
    }
    intact = intact && check_page_header(header, key, layout_, seal_, fault).ok();
    if (intact && !pread_full(fd.get(), slot.data(), slot.size(), static_cast<off_t>(kPageHeaderSize))) {
      if (errno != 0) return ReadOutcome::failed;
      intact = false;
    }
    intact = intact && check_page_body(header, slot, seal_, fault).ok();
    if (!intact) {
      // Removed only if the name still holds the file read: a writer may
      // have renamed a good page over it since.
      struct stat now;
      if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev &&
          ::unlink(path.c_str()) == 0) {
        counters_.repaired_pages.fetch_add(1, std::memory_order_relaxed);
      }
      return ReadOutcome::corrupt;
    }
    ::futimens(fd.get(), nullptr);  // last use, for the LRU order after a restart; best effort
    return ReadOutcome::found;
  }

  bool ensure_subdir(std::uint8_t first) {
    std::atomic<bool>& ready = subdir_ready_[first];
    if (ready.load(std::memory_order_acquire)) return true;
    if (::mkdir(subdir_path(first).c_str(), 0755) != 0 && errno != EEXIST) return false;
    ready.store(true, std::memory_order_release);
    return true;
  }

  // Header + payload under a temporary name, fsync, rename. False (the page
  // is dropped, the temporary file removed) on any failure: a full disk,
  // EDQUOT, EFBIG, no permission.
  bool write_page(const PageKey& key, std::span<const std::byte> payload) {
    const std::uint8_t first = key.bytes[0];
    const std::string final_path = page_path(key);
    const std::string temp_path = fmt::format("{}/{}{}-{}-{}", subdir_path(first), kTempPrefix, key.hex(), ::getpid(),
                                              temp_counter_.fetch_add(1, std::memory_order_relaxed));
    int raw = -1;
    for (int attempt = 0; attempt < 2 && raw < 0; ++attempt) {
      if (!ensure_subdir(first)) return false;
      raw = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      // The subdirectory went away under us (removed by hand): make it again once.
      if (raw < 0 && errno == ENOENT) subdir_ready_[first].store(false, std::memory_order_release);
    }
    if (raw < 0) return false;
    UniqueFd fd(raw);
    PageHeaderBytes header;
    const bool ok = encode_page_header(key, layout_, seal_, payload, header).ok() &&
                    write_full(fd.get(), header, payload) && ::fsync(fd.get()) == 0 && fd.close() == 0 &&
                    ::rename(temp_path.c_str(), final_path.c_str()) == 0;
    if (!ok) ::unlink(temp_path.c_str());
    return ok;
  }

  // Under mu_: `key` becomes the most recently used, indexed if it was not.
  void touch(const PageKey& key) {
    const auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
    lru_.push_front(key);
    index_.emplace(key, lru_.begin());
  }

  void forget(const PageKey& key) {
    std::lock_guard lock(mu_);
    const auto it = index_.find(key);
    if (it == index_.end()) return;
    lru_.erase(it->second);
    index_.erase(it);
  }

  // Under mu_: takes the least recently used pages out of the index until the
  // rest fit the cap; the caller removes their files outside the lock.
  void collect_victims(std::vector<PageKey>& victims) {
    if (capacity_bytes_ == 0) return;
    while (lru_.size() > 1 && lru_.size() * file_bytes_ > capacity_bytes_) {
      victims.push_back(lru_.back());
      index_.erase(lru_.back());
      lru_.pop_back();
    }
  }

  void remove_victims(const std::vector<PageKey>& victims) {
    for (const PageKey& key : victims) ::unlink(page_path(key).c_str());
    counters_.evicted_pages.fetch_add(victims.size(), std::memory_order_relaxed);
  }

  const std::string url_;
  const std::string root_;
  const PageLayout layout_;
  const PageSeal seal_;
  const std::size_t page_bytes_;
  const std::size_t file_bytes_;
  const std::uint64_t capacity_bytes_;                 // 0: no cap
  std::array<std::atomic<bool>, 256> subdir_ready_{};  // made lazily, by the first page under each
  std::atomic<std::uint64_t> temp_counter_{0};
  StorageCounters counters_;

  std::mutex mu_;
  std::list<PageKey> lru_;  // front: the most recently used
  std::unordered_map<PageKey, std::list<PageKey>::iterator, PageKeyHash> index_;
};

}  // namespace

Status open_file_backend(const StorageUrl& parsed, std::string url, const PageLayout& layout, const PageSeal& seal,
                         std::unique_ptr<StorageBackend>& out) {
  const std::uint64_t capacity_bytes = parsed.capacity_mb << 20;
  const std::size_t file_bytes = kPageHeaderSize + layout.page_bytes();
  if (capacity_bytes != 0 && capacity_bytes < file_bytes) {
    return invalid_argument(fmt::format("file storage {}: capacity_mb={} holds no page file of {} bytes", url,
                                        parsed.capacity_mb, file_bytes));
  }
  auto backend = std::make_unique<FileBackend>(std::move(url), parsed.path, layout, seal, capacity_bytes);
  CLM_RETURN_IF_ERROR(backend->open());
  out = std::move(backend);
  return {};
}

}  // namespace clm::tiers_detail
