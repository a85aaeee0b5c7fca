package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var sink [][]byte

//go:noinline
func allocateForProfileTest() {
	for range 2000 {
		sink = append(sink, make([]byte, 4096))
	}
}

// A run's allocation profile holds what the run allocated, by the function
// that allocated it, and not what the process allocated before.
func TestProfileAllocs(t *testing.T) {
	dir := t.TempDir()
	allocateForProfileTest() // before: must not show up in the run's profile
	sink = nil
	p, err := startProfile(dir, "test-run-r1")
	if err != nil {
		t.Fatal(err)
	}
	allocateForProfileTest()
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	sink = nil

	prof := readProfile(t, filepath.Join(dir, "test-run-r1.allocs.pprof"))
	fn := slices.Index(prof.strings, "github.com/amqpretry/amqpretry/bench.allocateForProfileTest")
	if fn < 0 {
		t.Fatalf("allocateForProfileTest is not in the profile's strings: %q", prof.strings)
	}
	if i := slices.Index(prof.strings, "alloc_space"); i < 0 || prof.defaultSampleType != int64(i) {
		t.Errorf("default sample type %d, want alloc_space's index %d", prof.defaultSampleType, i)
	}
	var bytes int64
	for _, s := range prof.samples {
		if len(s) != 4 {
			t.Fatalf("a sample with %d values, want 4", len(s))
		}
		bytes += s[1]
	}
	// 2000 × 4 KiB once: sampled and scaled back, about 8 MB; twice that
	// would mean the allocations before the run were counted too.
	if want := int64(2000 * 4096); bytes < want/2 || bytes > want*3/2+4<<20 {
		t.Errorf("%d bytes allocated in the run, want about %d", bytes, want)
	}
	if cpu := readGzip(t, filepath.Join(dir, "test-run-r1.cpu.pprof")); len(cpu) == 0 {
		t.Error("empty CPU profile")
	}
}

func TestUnsample(t *testing.T) {
	for _, c := range []struct{ objects, bytes, rate, wantObjects int64 }{
		{0, 0, 512 << 10, 0},
		{10, 1000, 1, 10},               // every allocation recorded
		{1, 1 << 30, 512 << 10, 1},      // huge: always sampled
		{-1, -(1 << 30), 512 << 10, -1}, // freed
	} {
		if got, _ := unsample(c.objects, c.bytes, c.rate); got != c.wantObjects {
			t.Errorf("unsample(%d, %d, %d) = %d objects, want %d", c.objects, c.bytes, c.rate, got, c.wantObjects)
		}
	}
	// Small allocations are rarely sampled: one seen stands for many.
	if got, _ := unsample(1, 64, 512<<10); got < 1000 {
		t.Errorf("one sampled 64-byte allocation stands for %d, want thousands", got)
	}
}

func readGzip(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return data
}

// decodedProfile is what the tests look at in a profile.proto message.
type decodedProfile struct {
	strings           []string
	samples           [][]int64
	defaultSampleType int64
}

// readProfile decodes the fields of a gzipped profile the tests need,
// reading the wire format directly.
func readProfile(t *testing.T, path string) decodedProfile {
	t.Helper()
	var p decodedProfile
	err := walkProto(readGzip(t, path), func(field int, v uint64, b []byte) error {
		switch field {
		case profStringTable:
			p.strings = append(p.strings, string(b))
		case profDefaultSampleType:
			p.defaultSampleType = int64(v)
		case profSample:
			var values []int64
			err := walkProto(b, func(field int, _ uint64, packed []byte) error {
				if field != sampleValue {
					return nil
				}
				r := bytes.NewReader(packed)
				for r.Len() > 0 {
					x, err := readVarint(r)
					if err != nil {
						return err
					}
					values = append(values, int64(x))
				}
				return nil
			})
			p.samples = append(p.samples, values)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

// walkProto calls f with every field of a message: a varint's value, or a
// length-delimited field's bytes. Other wire types are errors.
func walkProto(msg []byte, f func(field int, v uint64, b []byte) error) error {
	r := bytes.NewReader(msg)
	for r.Len() > 0 {
		key, err := readVarint(r)
		if err != nil {
			return err
		}
		var v uint64
		var b []byte
		switch key & 7 {
		case 0:
			if v, err = readVarint(r); err != nil {
				return err
			}
		case 2:
			n, err := readVarint(r)
			if err != nil {
				return err
			}
			b = make([]byte, n)
			if _, err := io.ReadFull(r, b); err != nil {
				return err
			}
		default:
			return io.ErrUnexpectedEOF
		}
		if err := f(int(key>>3), v, b); err != nil {
			return err
		}
	}
	return nil
}

func readVarint(r io.ByteReader) (uint64, error) {
	var x uint64
	for shift := 0; shift < 64; shift += 7 {
		c, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x, nil
		}
	}
	return 0, io.ErrUnexpectedEOF
}
