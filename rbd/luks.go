package rbd

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rbd-snapshot-metadata/rbd-snapshot-metadata/rbd/internal/cepherr"
	"hash"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	librbd "github.com/ceph/go-ceph/rbd"
)

// Ceph-CSI's block encryption (StorageClass parameter encrypted=true,
// encryptionType=block) formats the RBD image with LUKS2 when the volume is
// first staged, and the user sees the dm-crypt device: the image minus the
// LUKS header. Ceph-CSI marks such images in their metadata
// (internal/rbd/encryption.go), formats them with a 16 MiB header (4 MiB
// metadata area twice plus 8 MiB of keyslots, internal/util/cryptsetup),
// and since 3.15 records that size in rbd.csi.ceph.com/luks2HeaderSize;
// older images have cryptsetup's default, also 16 MiB.
const (
	metaEncrypted       = "rbd.csi.ceph.com/encrypted"
	metaEncryptedLegacy = ".rbd.csi.ceph.com/encrypted"
	metaLuks2HeaderSize = "rbd.csi.ceph.com/luks2HeaderSize"

	// defaultLuksHeaderSize is Ceph-CSI's LUKS2 header size, new and old.
	defaultLuksHeaderSize = 16 << 20
)

// luksHeaderSize returns how many bytes of the image at its current
// snapshot precede the user's data: 0 unless Ceph-CSI marked the image as
// block-encrypted. For an encrypted image the data offset is read from the
// LUKS header in the snapshot itself, which is what dm-crypt uses; when
// there is none (a volume that was never staged, so never formatted) or it
// cannot be read, from the image metadata luks2HeaderSize, else Ceph-CSI's
// default of 16 MiB.
//
// Implements (through go-ceph): rbd_metadata_get, rbd_read.
func luksHeaderSize(img *librbd.Image, size uint64) (int64, error) {
	state, err := img.GetMetadata(metaEncrypted)
	if errors.Is(err, librbd.ErrNotFound) {
		state, err = img.GetMetadata(metaEncryptedLegacy)
	}
	if errors.Is(err, librbd.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, cepherr.Wrap("read image metadata "+metaEncrypted, err)
	}
	switch strings.TrimSpace(state) {
	case "":
		return 0, nil
	case "encrypted", "encryptionPrepared", "requiresEncryption":
	default:
		return 0, fmt.Errorf("image metadata %s: unknown encryption state %q", metaEncrypted, state)
	}

	if off, err := luksDataOffset(io.NewSectionReader(img, 0, int64(min(size, math.MaxInt64)))); err == nil {
		return off, nil
	}
	if v, err := img.GetMetadata(metaLuks2HeaderSize); err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("image metadata %s: not a size: %q", metaLuks2HeaderSize, v)
		}
		return n, nil
	} else if !errors.Is(err, librbd.ErrNotFound) {
		return 0, cepherr.Wrap("read image metadata "+metaLuks2HeaderSize, err)
	}
	return defaultLuksHeaderSize, nil
}

// errNoLUKS means that a device does not start with a LUKS header.
var errNoLUKS = errors.New("no LUKS header")

// The on-disk LUKS formats (cryptsetup's docs/on-disk-format*.pdf).
var (
	luksMagic       = []byte("LUKS\xba\xbe")
	luks2MagicSecnd = []byte("SKUL\xba\xbe")
)

const (
	luksBinHeaderSize = 4096     // LUKS2 binary header before the JSON area
	luks2MinHdrSize   = 16 << 10 // binary header + JSON area, 16 KiB ...
	luks2MaxHdrSize   = 4 << 20  // ... to 4 MiB, a power of two
	luks1PayloadAt    = 104      // LUKS1: payload offset (u32, 512-byte sectors)
	luks2HdrSizeAt    = 8        // LUKS2: hdr_size (u64)
	luks2CsumAlgAt    = 72       // LUKS2: checksum algorithm (char[32])
	luks2CsumAt       = 448      // LUKS2: checksum (u8[64])
)

// luksDataOffset returns the byte offset of the encrypted payload of the
// LUKS1 or LUKS2 device dev. For LUKS2 it is the offset of the first data
// segment in the JSON metadata; the primary header is used when its
// checksum holds, else the secondary one. A device without the LUKS magic
// gives errNoLUKS.
func luksDataOffset(dev io.ReaderAt) (int64, error) {
	bin := make([]byte, luksBinHeaderSize)
	if _, err := dev.ReadAt(bin, 0); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read LUKS header: %w", err)
	}
	if !bytes.Equal(bin[:6], luksMagic) {
		return 0, errNoLUKS
	}
	switch v := binary.BigEndian.Uint16(bin[6:8]); v {
	case 1:
		sectors := binary.BigEndian.Uint32(bin[luks1PayloadAt:])
		if sectors == 0 {
			return 0, errors.New("LUKS1 header: payload offset 0")
		}
		return int64(sectors) * 512, nil
	case 2:
		off, err := luks2DataOffset(dev, bin, 0)
		if err == nil {
			return off, nil
		}
		// The secondary header follows the primary, at its hdr_size.
		hdrSize := binary.BigEndian.Uint64(bin[luks2HdrSizeAt:])
		if !validLuks2HdrSize(hdrSize) {
			return 0, err
		}
		sec := make([]byte, luksBinHeaderSize)
		if _, err2 := dev.ReadAt(sec, int64(hdrSize)); err2 != nil || !bytes.Equal(sec[:6], luks2MagicSecnd) {
			return 0, err
		}
		if off, err2 := luks2DataOffset(dev, sec, int64(hdrSize)); err2 == nil {
			return off, nil
		}
		return 0, err
	default:
		return 0, fmt.Errorf("LUKS header: unknown version %d", v)
	}
}

func validLuks2HdrSize(n uint64) bool {
	return n >= luks2MinHdrSize && n <= luks2MaxHdrSize && n&(n-1) == 0
}

// luks2DataOffset reads the LUKS2 header whose binary part bin was read at
// at, checks its checksum and returns its first data segment's offset.
func luks2DataOffset(dev io.ReaderAt, bin []byte, at int64) (int64, error) {
	hdrSize := binary.BigEndian.Uint64(bin[luks2HdrSizeAt:])
	if !validLuks2HdrSize(hdrSize) {
		return 0, fmt.Errorf("LUKS2 header at %d: bad header size %d", at, hdrSize)
	}
	area := make([]byte, hdrSize)
	copy(area, bin)
	if _, err := dev.ReadAt(area[luksBinHeaderSize:], at+luksBinHeaderSize); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read LUKS2 metadata at %d: %w", at, err)
	}
	if err := luks2CheckSum(area); err != nil {
		return 0, fmt.Errorf("LUKS2 header at %d: %w", at, err)
	}
	js := area[luksBinHeaderSize:]
	if i := bytes.IndexByte(js, 0); i >= 0 {
		js = js[:i]
	}
	var meta struct {
		Segments map[string]struct {
			Type   string `json:"type"`
			Offset string `json:"offset"`
		} `json:"segments"`
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return 0, fmt.Errorf("LUKS2 metadata at %d: %v", at, err)
	}
	keys := make([]int, 0, len(meta.Segments))
	for k := range meta.Segments {
		n, err := strconv.Atoi(k)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("LUKS2 metadata at %d: bad segment %q", at, k)
		}
		keys = append(keys, n)
	}
	if len(keys) == 0 {
		return 0, fmt.Errorf("LUKS2 metadata at %d: no data segment", at)
	}
	sort.Ints(keys)
	seg := meta.Segments[strconv.Itoa(keys[0])]
	off, err := strconv.ParseInt(seg.Offset, 10, 64)
	if err != nil || off < 0 {
		return 0, fmt.Errorf("LUKS2 metadata at %d: bad segment offset %q", at, seg.Offset)
	}
	return off, nil
}

// luks2CheckSum verifies the checksum of a LUKS2 header area (binary header
// and JSON), computed with the checksum field zeroed. Algorithms other than
// sha1, sha256 and sha512 are not checked.
func luks2CheckSum(area []byte) error {
	alg := area[luks2CsumAlgAt : luks2CsumAlgAt+32]
	if i := bytes.IndexByte(alg, 0); i >= 0 {
		alg = alg[:i]
	}
	var h hash.Hash
	switch string(alg) {
	case "sha1":
		h = sha1.New()
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		return nil
	}
	var want [64]byte
	copy(want[:], area[luks2CsumAt:luks2CsumAt+64])
	h.Write(area[:luks2CsumAt])
	h.Write(make([]byte, 64))
	h.Write(area[luks2CsumAt+64:])
	if !bytes.Equal(h.Sum(nil), want[:h.Size()]) {
		return fmt.Errorf("%s checksum mismatch", alg)
	}
	return nil
}
