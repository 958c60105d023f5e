/*
 * radospp.h: the librados queries of precise mode that librados' C API
 * (and so go-ceph) lacks, behind extern "C" for cgo. radospp.cpp implements
 * them with librados' C++ API (librados.hpp, Debian's libradospp-dev).
 *
 * All take a go-ceph ioctx (IOContext.Pointer()) whose read snapshot the
 * caller has set with rados_ioctx_snap_set_read; they never change it, so
 * they may run concurrently on one ioctx. On success they return 0 and a
 * malloc'd array of *n words in *out, which the caller frees with free();
 * on failure a negative errno (-ENOENT: no such object at that snapshot)
 * and nothing to free.
 */
#ifndef RSM_RADOSPP_H
#define RSM_RADOSPP_H

#include <stddef.h>
#include <stdint.h>
#include <rados/librados.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * rsm_list_snaps: IoCtx::list_snaps, which needs the read snapshot
 * LIBRADOS_SNAP_DIR. The object's snap set, flattened:
 *   seq, nclones, then per clone (ascending, the head last as cloneid
 *   LIBRADOS_SNAP_HEAD): cloneid, size, nsnaps, snaps..., noverlap,
 *   (offset, length) * noverlap.
 */
int rsm_list_snaps(rados_ioctx_t io, const char *oid, uint64_t **out, size_t *n);

/*
 * rsm_list_snaps_batch: rsm_list_snaps of count objects at once, all in
 * flight together (aio), in one call. Per object, in order: its result
 * (0 or a negative errno, as a two's complement int64), the number of
 * words that follow, then its snap set as rsm_list_snaps gives it (none
 * on error). A failure to start a query fails the whole call.
 */
int rsm_list_snaps_batch(rados_ioctx_t io, const char *const *oids, size_t count, uint64_t **out, size_t *n);

/*
 * rsm_mapext: IoCtx::mapext, the allocated extents of the object at the
 * ioctx's read snapshot within [off, off+len), without data:
 *   (offset, length) * (n / 2), ascending.
 * An erasure-coded pool answers -EOPNOTSUPP.
 */
int rsm_mapext(rados_ioctx_t io, const char *oid, uint64_t off, uint64_t len, uint64_t **out, size_t *n);

/*
 * rsm_checksum: ObjectReadOperation::checksum, xxhash64 with seed 0 of each
 * chunk-byte chunk of [off, off+len) at the ioctx's read snapshot: *n
 * hashes, in order. The OSD computes them from the data, which never
 * travels; it answers -EINVAL when len is not a multiple of chunk, or when
 * the range runs past the object's end and what is left is not. Erasure-
 * coded pools answer it (reef 18.2.7), unlike mapext.
 */
int rsm_checksum(rados_ioctx_t io, const char *oid, uint64_t off, uint64_t len, uint64_t chunk,
                 uint64_t **out, size_t *n);

#ifdef __cplusplus
}
#endif

#endif
