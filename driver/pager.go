package driver

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// A pager turns the extents of one diff into pages of BlockMetadata tuples,
// as the CSI spec wants them, and hands each page to send as soon as it is
// full. Both RPCs use it; they differ only in the message that wraps a page.
//
// Its contract, for a stream that starts at offset S of a volume of
// capacity C:
//   - tuples are strictly ascending and never overlap, across pages too;
//   - the first tuple ends after S, and no tuple starts at or after C;
//   - VARIABLE_LENGTH: adjacent or overlapping extents are merged, and
//     tuples are clipped to [S, C);
//   - FIXED_LENGTH: every tuple is one block of the grid that starts at 0,
//     extents are rounded out to whole blocks, and a block that two extents
//     share is sent once;
//   - a page holds 1..pageSize tuples; only the last page may be short.
//
// Every byte of every extent in [S, C) is covered by a tuple. Memory is one
// page plus the one VARIABLE_LENGTH tuple that may still grow.
//
// A pager is not safe for concurrent use: one diff feeds one pager.
type pager struct {
	fixed    bool
	block    int64 // FIXED_LENGTH tuple size
	start    int64
	limit    int64 // the volume's capacity
	pageSize int   // tuples per page (max_results, or the default)
	send     func([]*csi.BlockMetadata) error

	page []*csi.BlockMetadata
	// VARIABLE_LENGTH: the last tuple, not yet in page, as it may still
	// grow when the next extent is adjacent.
	pend    Extent
	hasPend bool
	// end is where the last tuple taken ends: no later tuple may start
	// before it.
	end int64
	// prev is where the last extent added starts, clipped: extents must
	// come in ascending order.
	prev int64
	// recv is where the extents received so far end, clipped: every byte
	// of the diff below it is in a tuple taken or pending. A resumed diff
	// goes on from there (see resume).
	recv int64

	pages, tuples int
	bytes         int64
}

// newPager makes a pager for a stream from start over a volume of capacity
// limit. block is used only for FIXED_LENGTH and must be positive there.
func newPager(t csi.BlockMetadataType, block, start, limit int64, pageSize int, send func([]*csi.BlockMetadata) error) *pager {
	return &pager{
		fixed:    t == csi.BlockMetadataType_FIXED_LENGTH,
		block:    block,
		start:    start,
		limit:    limit,
		pageSize: pageSize,
		send:     send,
		end:      start,
		recv:     start,
	}
}

// add takes the next extent of the diff. Extents must come in ascending
// order of Offset, and may overlap or touch the one before. An extent that
// starts before the one before it means a broken source: add refuses it
// rather than lose or repeat data.
func (p *pager) add(e Extent) error {
	if e.Length < 0 || e.Offset+e.Length < e.Offset {
		return fmt.Errorf("%w: extent %d+%d", errBadExtent, e.Offset, e.Length)
	}
	off, end := max(e.Offset, p.start), min(e.Offset+e.Length, p.limit)
	if end <= off {
		return nil
	}
	if off < p.prev {
		return fmt.Errorf("%w: extent at %d after one at %d", errExtentOrder, off, p.prev)
	}
	p.prev = off
	p.recv = max(p.recv, end)
	if p.fixed {
		return p.addBlocks(off, end)
	}
	if p.hasPend && off <= p.pend.Offset+p.pend.Length {
		p.pend.Length = max(p.pend.Length, end-p.pend.Offset)
		return nil
	}
	if err := p.flushPend(); err != nil {
		return err
	}
	p.pend, p.hasPend = Extent{Offset: off, Length: end - off}, true
	return nil
}

// addBlocks takes the blocks of the grid that [off, end) touches, skipping
// those already taken.
func (p *pager) addBlocks(off, end int64) error {
	b := off - off%p.block
	if b < p.end && p.tuples > 0 {
		b = p.end
	}
	for ; b < end; b += p.block {
		if err := p.take(b, p.block); err != nil {
			return err
		}
	}
	return nil
}

func (p *pager) flushPend() error {
	if !p.hasPend {
		return nil
	}
	p.hasPend = false
	return p.take(p.pend.Offset, p.pend.Length)
}

// take appends one tuple to the page and sends the page when it is full.
func (p *pager) take(off, size int64) error {
	if p.page == nil {
		p.page = newPage(p.pageSize)
	}
	t := p.page[len(p.page) : len(p.page)+1]
	t[0].ByteOffset, t[0].SizeBytes = off, size
	p.page = p.page[:len(p.page)+1]
	p.end = off + size
	p.tuples++
	p.bytes += size
	if len(p.page) == p.pageSize {
		return p.sendPage()
	}
	return nil
}

// newPage allocates a page's tuples in one block. A sent page is never
// reused: gRPC does not allow changing a message once it is sent.
func newPage(n int) []*csi.BlockMetadata {
	backing := make([]csi.BlockMetadata, n)
	page := make([]*csi.BlockMetadata, n)
	for i := range backing {
		page[i] = &backing[i]
	}
	return page[:0]
}

func (p *pager) sendPage() error {
	page := p.page
	p.page = nil
	p.pages++
	return p.send(page)
}

// resume prepares the pager for the rest of a diff that failed and is run
// again, and returns the offset it must go on from: the end of the extents
// received. The page not yet sent and the pending tuple stay. The extents
// of the new run may start below it (they are clipped to it, those that
// end below it are dropped: every byte of them was received), and must then
// be those an uninterrupted diff would have delivered: the same tuples
// follow, in FIXED_LENGTH without the block shared across the seam twice,
// in VARIABLE_LENGTH merged with the pending tuple as they would have
// been. Every invariant above holds across the seam as across a page.
func (p *pager) resume() int64 {
	p.start = p.recv
	return p.recv
}

// finish sends what is left: the pending tuple and the last, short page.
// It must be called once, after the diff has delivered every extent.
func (p *pager) finish() error {
	if err := p.flushPend(); err != nil {
		return err
	}
	if len(p.page) > 0 {
		return p.sendPage()
	}
	return nil
}
