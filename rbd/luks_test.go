package rbd

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

// luks2Header builds a LUKS2 device start: primary and secondary headers of
// hdrSize bytes each, with a data segment at offset, sha256-checksummed as
// cryptsetup writes them.
func luks2Header(hdrSize uint64, offset string) []byte {
	dev := make([]byte, 2*hdrSize)
	js := fmt.Sprintf(`{"keyslots":{},"tokens":{},"segments":{"0":{"type":"crypt","offset":%q,"size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{},"config":{"json_size":"%d","keyslots_size":"8388608"}}`,
		offset, hdrSize-4096)
	for i, magic := range [][]byte{luksMagic, luks2MagicSecnd} {
		area := dev[uint64(i)*hdrSize : uint64(i+1)*hdrSize]
		copy(area, magic)
		binary.BigEndian.PutUint16(area[6:], 2)
		binary.BigEndian.PutUint64(area[luks2HdrSizeAt:], hdrSize)
		binary.BigEndian.PutUint64(area[16:], 3) // seqid
		copy(area[luks2CsumAlgAt:], "sha256")
		binary.BigEndian.PutUint64(area[256:], uint64(i)*hdrSize) // hdr_offset
		copy(area[luksBinHeaderSize:], js)
		sum := sha256.Sum256(area)
		copy(area[luks2CsumAt:], sum[:])
	}
	return dev
}

func TestLuksDataOffset(t *testing.T) {
	const mib = 1 << 20
	ceph := luks2Header(4*mib, "16777216")  // Ceph-CSI: 4 MiB metadata, 16 MiB header
	small := luks2Header(16<<10, "8388608") // cryptsetup's minimum metadata size

	corruptPrimary := bytes.Clone(ceph)
	corruptPrimary[5000] ^= 1 // in the JSON area
	corruptBoth := bytes.Clone(corruptPrimary)
	corruptBoth[4*mib+5000] ^= 1

	noSegments := luks2Header(16<<10, "0")
	for i := 0; i < 2; i++ { // no checksum algorithm: not verified
		copy(noSegments[i*(16<<10)+4096:], `{"segments":{}}`+"\x00")
		copy(noSegments[i*(16<<10)+luks2CsumAlgAt:], make([]byte, 32))
	}

	luks1 := make([]byte, 4096)
	copy(luks1, luksMagic)
	binary.BigEndian.PutUint16(luks1[6:], 1)
	binary.BigEndian.PutUint32(luks1[luks1PayloadAt:], 4096) // sectors: 2 MiB

	badVersion := bytes.Clone(small)
	binary.BigEndian.PutUint16(badVersion[6:], 3)
	badSize := bytes.Clone(small)
	binary.BigEndian.PutUint64(badSize[luks2HdrSizeAt:], 12345)

	for _, tc := range []struct {
		name string
		dev  []byte
		want int64
		err  string // "" for success
	}{
		{"ceph-csi", ceph, 16 * mib, ""},
		{"small", small, 8 * mib, ""},
		{"primary corrupt, secondary good", corruptPrimary, 16 * mib, ""},
		{"both corrupt", corruptBoth, 0, "checksum mismatch"},
		{"no segments", noSegments, 0, "no data segment"},
		{"luks1", luks1, 2 * mib, ""},
		{"unknown version", badVersion, 0, "unknown version 3"},
		{"bad header size", badSize, 0, "bad header size"},
		{"zeros", make([]byte, 8192), 0, errNoLUKS.Error()},
		{"short device", []byte("LUKS"), 0, errNoLUKS.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := luksDataOffset(bytes.NewReader(tc.dev))
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("luksDataOffset = %d, %v; want %d", got, err, tc.want)
				}
				return
			}
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
				t.Fatalf("luksDataOffset = %d, %v; want an error mentioning %q", got, err, tc.err)
			}
		})
	}
	if _, err := luksDataOffset(bytes.NewReader(nil)); !errors.Is(err, errNoLUKS) {
		t.Errorf("empty device: %v, want errNoLUKS", err)
	}
}

func FuzzLuksDataOffset(f *testing.F) {
	f.Add(luks2Header(16<<10, "16777216")[:16<<10])
	f.Add([]byte("LUKS\xba\xbe\x00\x01"))
	f.Add([]byte("LUKS\xba\xbe\x00\x02\x00\x00\x00\x00\x00\x00\x40\x00"))
	f.Fuzz(func(t *testing.T, dev []byte) {
		off, err := luksDataOffset(bytes.NewReader(dev))
		if err == nil && off < 0 {
			t.Fatalf("negative offset %d", off)
		}
	})
}
