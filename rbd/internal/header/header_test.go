package header

import (
	"encoding/binary"
	"testing"
)

func TestDecodeParentSpec(t *testing.T) {
	str := func(b []byte, s string) []byte {
		return append(binary.LittleEndian.AppendUint32(b, uint32(len(s))), s...)
	}
	var body []byte
	body = binary.LittleEndian.AppendUint64(body, 7)
	body = str(body, "ns1")
	body = str(body, "10aa3c6b8f1e")
	body = binary.LittleEndian.AppendUint64(body, 42)
	b := append([]byte{1, 1}, binary.LittleEndian.AppendUint32(nil, uint32(len(body)))...)
	b = append(b, body...)
	got, err := decodeParentSpec(b)
	want := Spec{PoolID: 7, Namespace: "ns1", ImageID: "10aa3c6b8f1e", SnapID: 42}
	if err != nil || got != want {
		t.Fatalf("decodeParentSpec = %+v, %v; want %+v", got, err, want)
	}
	// No parent: pool -1.
	none := append([]byte{1, 1}, binary.LittleEndian.AppendUint32(nil, 24)...)
	none = binary.LittleEndian.AppendUint64(none, ^uint64(0))
	none = str(str(none, ""), "")
	none = binary.LittleEndian.AppendUint64(none, ^uint64(1))
	if got, err := decodeParentSpec(none); err != nil || got.PoolID != -1 {
		t.Fatalf("no parent: %+v, %v", got, err)
	}
	for n := range len(b) {
		if _, err := decodeParentSpec(b[:n]); err == nil {
			t.Errorf("%d of %d bytes decoded without error", n, len(b))
		}
	}
}
