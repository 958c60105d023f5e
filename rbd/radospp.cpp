// radospp.cpp: see radospp.h. Kept deliberately small: it borrows go-ceph's
// ioctx (IoCtx::from_rados_ioctx_t takes a reference, the IoCtx destructor
// drops it), makes synchronous librados calls, and copies the answer
// into a flat malloc'd array of uint64_t. No exception crosses into C.
//
// Built against Debian 12's pacific headers, it runs unchanged against
// reef's librados: the C++ symbols it uses are stable across the two.

#include "radospp.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <rados/librados.hpp>

namespace {

// hand moves words into a malloc'd array owned by the caller.
int hand(const std::vector<uint64_t> &words, uint64_t **out, size_t *n) {
  uint64_t *buf = static_cast<uint64_t *>(std::malloc((words.size() + 1) * sizeof(uint64_t)));
  if (buf == nullptr) {
    return -ENOMEM;
  }
  for (size_t i = 0; i < words.size(); i++) {
    buf[i] = words[i];
  }
  *out = buf;
  *n = words.size();
  return 0;
}

}  // namespace

extern "C" int rsm_list_snaps(rados_ioctx_t io, const char *oid, uint64_t **out, size_t *n) {
  try {
    librados::IoCtx ioctx;
    librados::IoCtx::from_rados_ioctx_t(io, ioctx);
    librados::snap_set_t ss;
    int r = ioctx.list_snaps(oid, &ss);
    if (r < 0) {
      return r;
    }
    std::vector<uint64_t> w{ss.seq, ss.clones.size()};
    for (const auto &c : ss.clones) {
      w.push_back(c.cloneid);
      w.push_back(c.size);
      w.push_back(c.snaps.size());
      w.insert(w.end(), c.snaps.begin(), c.snaps.end());
      w.push_back(c.overlap.size());
      for (const auto &o : c.overlap) {
        w.push_back(o.first);
        w.push_back(o.second);
      }
    }
    return hand(w, out, n);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

extern "C" int rsm_mapext(rados_ioctx_t io, const char *oid, uint64_t off, uint64_t len, uint64_t **out, size_t *n) {
  try {
    librados::IoCtx ioctx;
    librados::IoCtx::from_rados_ioctx_t(io, ioctx);
    std::map<uint64_t, uint64_t> m;
    int r = ioctx.mapext(oid, off, len, m);
    if (r < 0) {
      return r;
    }
    std::vector<uint64_t> w;
    w.reserve(2 * m.size());
    for (const auto &e : m) {
      w.push_back(e.first);
      w.push_back(e.second);
    }
    return hand(w, out, n);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

extern "C" int rsm_chunk_sums(rados_ioctx_t io, const char *oid, uint64_t off, uint64_t len, uint64_t chunk,
                              uint64_t **out, size_t *n) {
  try {
    if (chunk == 0 || off % chunk != 0 || len % chunk != 0) {
      return -EINVAL;
    }
    librados::IoCtx ioctx;
    librados::IoCtx::from_rados_ioctx_t(io, ioctx);
    uint64_t size = 0;
    time_t mtime;
    int r = ioctx.stat(oid, &size, &mtime);
    if (r < 0) {
      return r;
    }
    std::vector<uint64_t> w{size};
    uint64_t whole = size - size % chunk;  // the object's last whole chunk ends here
    uint64_t end = off + len < whole ? off + len : whole;
    if (off < end) {
      librados::bufferlist seed, bl;
      uint64_t zero = 0;
      seed.append(reinterpret_cast<const char *>(&zero), sizeof(zero));
      r = ioctx.checksum(oid, LIBRADOS_CHECKSUM_TYPE_XXHASH64, seed, end - off, off, chunk, &bl);
      if (r < 0) {
        return r;
      }
      // The answer: a little-endian 32-bit count, then that many 64-bit sums.
      uint64_t count = (end - off) / chunk;
      uint32_t got = 0;
      if (bl.length() != 4 + 8 * count) {
        return -EIO;
      }
      bl.begin().copy(4, reinterpret_cast<char *>(&got));
      if (got != count) {
        return -EIO;
      }
      std::vector<uint64_t> sums(count);
      auto it = bl.begin(4);
      it.copy(8 * count, reinterpret_cast<char *>(sums.data()));
      w.insert(w.end(), sums.begin(), sums.end());
    }
    return hand(w, out, n);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

extern "C" void rsm_silence_cerr(void) { std::cerr.rdbuf(nullptr); }
