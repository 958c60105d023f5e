// radospp.cpp: see radospp.h. Kept deliberately small: it borrows go-ceph's
// ioctx (IoCtx::from_rados_ioctx_t takes a reference, the IoCtx destructor
// drops it), makes librados calls (a batch of them in flight at once
// in rsm_list_snaps_batch), and copies the answer
// into a flat malloc'd array of uint64_t. No exception crosses into C.
//
// Built against Debian 12's pacific headers, it runs unchanged against
// reef's librados: the C++ symbols it uses are stable across the two.

#include "radospp.h"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <rados/librados.hpp>

namespace {

// flatten appends the snap set in rsm_list_snaps' form to w.
void flatten(const librados::snap_set_t &ss, std::vector<uint64_t> &w) {
  w.push_back(ss.seq);
  w.push_back(ss.clones.size());
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
}

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
    std::vector<uint64_t> w;
    flatten(ss, w);
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

extern "C" int rsm_list_snaps_batch(rados_ioctx_t io, const char *const *oids, size_t count, uint64_t **out, size_t *n) {
  struct query {
    librados::ObjectReadOperation op;
    librados::snap_set_t ss;
    int rval = 0;
    librados::AioCompletion *c = nullptr;
  };
  std::vector<query> qs;
  librados::IoCtx ioctx;
  try {
    librados::IoCtx::from_rados_ioctx_t(io, ioctx);
    qs.resize(count);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
  // Start every query; once one is in flight, nothing may leave this
  // function before it completed, since its operation points into qs.
  int r = 0;
  size_t started = 0;
  for (; started < count; started++) {
    query &q = qs[started];
    try {
      q.op.list_snaps(&q.ss, &q.rval);
      q.c = librados::Rados::aio_create_completion();
      r = ioctx.aio_operate(oids[started], q.c, &q.op, nullptr);
    } catch (const std::bad_alloc &) {
      r = -ENOMEM;
    } catch (...) {
      r = -EIO;
    }
    if (r < 0) {
      if (q.c != nullptr) {
        q.c->release();
        q.c = nullptr;
      }
      break;
    }
  }
  for (size_t i = 0; i < started; i++) {
    query &q = qs[i];
    q.c->wait_for_complete();
    int rc = q.c->get_return_value();
    q.c->release();
    q.c = nullptr;
    if (rc < 0) {
      q.rval = rc;
    }
  }
  if (r < 0) {
    return r;
  }
  try {
    std::vector<uint64_t> w;
    for (query &q : qs) {
      w.push_back(static_cast<uint64_t>(static_cast<int64_t>(q.rval)));
      if (q.rval < 0) {
        w.push_back(0);
        continue;
      }
      size_t at = w.size();
      w.push_back(0);
      flatten(q.ss, w);
      w[at] = w.size() - at - 1;
    }
    return hand(w, out, n);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}

extern "C" int rsm_checksum(rados_ioctx_t io, const char *oid, uint64_t off, uint64_t len, uint64_t chunk,
                            uint64_t **out, size_t *n) {
  try {
    librados::IoCtx ioctx;
    librados::IoCtx::from_rados_ioctx_t(io, ioctx);
    librados::bufferlist seed, sums;
    const uint64_t zero = 0;
    seed.append(reinterpret_cast<const char *>(&zero), sizeof(zero));
    int rv = 0;
    librados::ObjectReadOperation op;
    op.checksum(LIBRADOS_CHECKSUM_TYPE_XXHASH64, seed, off, len, chunk, &sums, &rv);
    int r = ioctx.operate(oid, &op, nullptr);
    if (r < 0) {
      return r;
    }
    if (rv < 0) {
      return rv;
    }
    // The answer: a little-endian uint32 count, then count uint64 values.
    uint32_t count = 0;
    if (sums.length() < sizeof(count)) {
      return -EIO;
    }
    auto it = sums.cbegin();
    it.copy(sizeof(count), reinterpret_cast<char *>(&count));
    if (sums.length() != sizeof(count) + uint64_t(count) * sizeof(uint64_t)) {
      return -EIO;
    }
    std::vector<uint64_t> w(count);
    it.copy(count * sizeof(uint64_t), reinterpret_cast<char *>(w.data()));
    return hand(w, out, n);
  } catch (const std::bad_alloc &) {
    return -ENOMEM;
  } catch (...) {
    return -EIO;
  }
}
