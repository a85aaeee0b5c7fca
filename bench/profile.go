package main

import (
	"compress/gzip"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

// profile is one measured run's profiling: a CPU profile running from
// startProfile to stop, and the allocations made in between.
type profile struct {
	cpu    *os.File
	allocs string // where stop writes the allocation profile
	before map[memStack]memCounts
	began  time.Time
}

// startProfile starts the CPU profile dir/name.cpu.pprof and notes the
// allocations so far, for stop's dir/name.allocs.pprof.
func startProfile(dir, name string) (*profile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name+".cpu.pprof"))
	if err != nil {
		return nil, err
	}
	runtime.GC() // publishes the allocations so far to the memory profile
	p := &profile{cpu: f, allocs: filepath.Join(dir, name+".allocs.pprof"), before: memProfile()}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("CPU profile: %w", err), f.Close())
	}
	p.began = time.Now()
	return p, nil
}

// stop ends the CPU profile and writes the allocation profile of the run.
func (p *profile) stop() error {
	pprof.StopCPUProfile()
	err := p.cpu.Close()
	elapsed := time.Since(p.began)
	runtime.GC() // publishes the run's allocations to the memory profile
	return errors.Join(err, writeAllocs(p.allocs, p.before, memProfile(), p.began, elapsed))
}

// Go's own allocs profile counts from the program's start: a run's profile
// written with pprof.Lookup("allocs") would hold every earlier run's too, and
// merging rounds would count those again and again. So the allocation
// profile of a run is the difference of the runtime's records before and
// after it, encoded here in pprof's format (profile.proto).

// memStack is a memory profile record's call stack, leaf first, zero-padded.
type memStack [32]uintptr

type memCounts struct {
	allocObjects, allocBytes, inuseObjects, inuseBytes int64
}

// memProfile returns the runtime's allocation records by call stack.
func memProfile() map[memStack]memCounts {
	var records []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		records = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(records, true); ok {
			records = records[:n]
			break
		}
	}
	m := make(map[memStack]memCounts, len(records))
	for _, r := range records {
		c := m[r.Stack0]
		c.allocObjects += r.AllocObjects
		c.allocBytes += r.AllocBytes
		c.inuseObjects += r.InUseObjects()
		c.inuseBytes += r.InUseBytes()
		m[r.Stack0] = c
	}
	return m
}

// writeAllocs writes, gzipped, the allocations made between the snapshots
// before and after, with pprof's four heap sample types (alloc_space
// shown by default; inuse_* is the change of what is live, which may be
// negative).
func writeAllocs(path string, before, after map[memStack]memCounts, began time.Time, d time.Duration) error {
	rate := int64(runtime.MemProfileRate)
	e := newProfileEncoder()
	e.valueTypes(profSampleType,
		"alloc_objects", "count", "alloc_space", "bytes", "inuse_objects", "count", "inuse_space", "bytes")
	for stack, a := range after {
		b := before[stack]
		allocObjects, allocBytes := unsample(a.allocObjects-b.allocObjects, a.allocBytes-b.allocBytes, rate)
		inuseObjects, inuseBytes := unsample(a.inuseObjects-b.inuseObjects, a.inuseBytes-b.inuseBytes, rate)
		if allocObjects == 0 && inuseObjects == 0 {
			continue
		}
		e.sample(stack[:], allocObjects, allocBytes, inuseObjects, inuseBytes)
	}
	e.finish(began, d, "space", "bytes", rate, "alloc_space")

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	z := gzip.NewWriter(f)
	_, err = z.Write(e.profile.b)
	return errors.Join(err, z.Close(), f.Close())
}

// unsample estimates the true counts from sampled ones: the runtime records
// an allocation of s bytes with probability 1-exp(-s/rate), so each record
// of that average size stands for 1/(1-exp(-s/rate)) allocations. Negative
// counts (frees exceeding allocations, for inuse) scale like positive ones.
func unsample(objects, bytes, rate int64) (int64, int64) {
	if objects == 0 || bytes == 0 || rate <= 1 {
		return objects, bytes
	}
	avg := math.Abs(float64(bytes) / float64(objects))
	scale := 1 / (1 - math.Exp(-avg/float64(rate)))
	return int64(math.Round(float64(objects) * scale)), int64(math.Round(float64(bytes) * scale))
}

// profileMemRate is the allocation sampling rate of profiled runs, in bytes:
// Go's default, one sample per 512 KiB, is too coarse for a run of a few
// thousand messages to show where each one's allocations go.
const profileMemRate = 16 << 10

// Field numbers of profile.proto, the format go tool pprof reads.
const (
	profSampleType        = 1
	profSample            = 2
	profLocation          = 4
	profFunction          = 5
	profStringTable       = 6
	profTimeNanos         = 9
	profDurationNanos     = 10
	profPeriodType        = 11
	profPeriod            = 12
	profDefaultSampleType = 14

	valueTypeType = 1
	valueTypeUnit = 2

	sampleLocationID = 1
	sampleValue      = 2

	locationID      = 1
	locationAddress = 3
	locationLine    = 4

	lineFunctionID = 1
	lineLine       = 2

	functionID         = 1
	functionName       = 2
	functionSystemName = 3
	functionFilename   = 4
	functionStartLine  = 5
)

// profileEncoder builds a profile.proto message: samples as they come,
// with their locations and functions numbered on first sight.
type profileEncoder struct {
	profile   protoWriter
	strings   map[string]int64
	table     []string
	locations map[uintptr][]uint64 // a return PC: its frames' location ids, leaf first
	functions map[string]uint64
	nextLoc   uint64
}

func newProfileEncoder() *profileEncoder {
	return &profileEncoder{
		strings:   map[string]int64{"": 0},
		table:     []string{""},
		locations: map[uintptr][]uint64{},
		functions: map[string]uint64{},
	}
}

// str is s's index in the string table.
func (e *profileEncoder) str(s string) int64 {
	if i, ok := e.strings[s]; ok {
		return i
	}
	i := int64(len(e.table))
	e.strings[s] = i
	e.table = append(e.table, s)
	return i
}

// valueTypes writes a ValueType message under field for each type, unit pair.
func (e *profileEncoder) valueTypes(field int, typeUnit ...string) {
	for i := 0; i+1 < len(typeUnit); i += 2 {
		e.profile.message(field, e.valueType(typeUnit[i], typeUnit[i+1]))
	}
}

func (e *profileEncoder) valueType(typ, unit string) []byte {
	var vt protoWriter
	vt.int(valueTypeType, e.str(typ))
	vt.int(valueTypeUnit, e.str(unit))
	return vt.b
}

// sample writes one sample of the stack (return PCs, leaf first, zero
// padded) with its values. The runtime's own frames at the leaf (mallocgc
// and its helpers) are left out, as Go's heap profiles leave them out: the
// allocation is charged to the code that asked for it.
func (e *profileEncoder) sample(stack []uintptr, values ...int64) {
	if i := slices.Index(stack, 0); i >= 0 {
		stack = stack[:i]
	}
	user := stack
	for len(user) > 0 && isRuntime(user[0]) {
		user = user[1:]
	}
	if len(user) > 0 {
		stack = user
	}
	var ids []uint64
	for _, pc := range stack {
		ids = append(ids, e.location(pc)...)
	}
	var s protoWriter
	s.packed(sampleLocationID, ids)
	vs := make([]uint64, len(values))
	for i, v := range values {
		vs[i] = uint64(v) // int64 in two's complement, as proto's int64 is
	}
	s.packed(sampleValue, vs)
	e.profile.message(profSample, s.b)
}

// isRuntime reports whether the return PC pc is in package runtime.
func isRuntime(pc uintptr) bool {
	f := runtime.FuncForPC(pc - 1)
	return f != nil && strings.HasPrefix(f.Name(), "runtime.")
}

// location returns the location ids of a return PC's frames, inlined
// callees first: one location per frame, each with a single line.
func (e *profileEncoder) location(pc uintptr) []uint64 {
	if ids, ok := e.locations[pc]; ok {
		return ids
	}
	var ids []uint64
	frames := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := frames.Next()
		e.nextLoc++
		id := e.nextLoc
		var line protoWriter
		line.uint(lineFunctionID, e.function(f))
		line.int(lineLine, int64(f.Line))
		var loc protoWriter
		loc.uint(locationID, id)
		loc.uint(locationAddress, uint64(f.PC))
		loc.message(locationLine, line.b)
		e.profile.message(profLocation, loc.b)
		ids = append(ids, id)
		if !more {
			break
		}
	}
	e.locations[pc] = ids
	return ids
}

// function returns the id of f's function, writing it on first sight.
func (e *profileEncoder) function(f runtime.Frame) uint64 {
	name := f.Function
	if name == "" {
		name = fmt.Sprintf("%#x", f.PC)
	}
	if id, ok := e.functions[name]; ok {
		return id
	}
	id := uint64(len(e.functions) + 1)
	e.functions[name] = id
	var fn protoWriter
	fn.uint(functionID, id)
	fn.int(functionName, e.str(name))
	fn.int(functionSystemName, e.str(name))
	fn.int(functionFilename, e.str(f.File))
	if f.Func != nil {
		_, start := f.Func.FileLine(f.Func.Entry())
		fn.int(functionStartLine, int64(start))
	}
	e.profile.message(profFunction, fn.b)
	return id
}

// finish writes the profile's fields that follow the samples, the string
// table last, since everything before may add to it.
func (e *profileEncoder) finish(began time.Time, d time.Duration, periodType, periodUnit string, period int64, defaultType string) {
	e.profile.int(profTimeNanos, began.UnixNano())
	e.profile.int(profDurationNanos, d.Nanoseconds())
	e.profile.message(profPeriodType, e.valueType(periodType, periodUnit))
	e.profile.int(profPeriod, period)
	e.profile.int(profDefaultSampleType, e.str(defaultType))
	for _, s := range e.table {
		e.profile.bytes(profStringTable, []byte(s))
	}
}

// protoWriter appends protocol buffer fields in the wire format: varints
// (wire type 0) and length-delimited bytes (wire type 2).
type protoWriter struct{ b []byte }

func (w *protoWriter) varint(x uint64) {
	for x >= 0x80 {
		w.b = append(w.b, byte(x)|0x80)
		x >>= 7
	}
	w.b = append(w.b, byte(x))
}

// Wire types of the fields written.
const (
	wireVarint = 0
	wireBytes  = 2
)

// key starts a field: its number and wire type.
func (w *protoWriter) key(field int, wireType uint64) { w.varint(uint64(field)<<3 | wireType) }

func (w *protoWriter) uint(field int, x uint64) {
	w.key(field, wireVarint)
	w.varint(x)
}

func (w *protoWriter) int(field int, x int64) { w.uint(field, uint64(x)) }

func (w *protoWriter) bytes(field int, b []byte) {
	w.key(field, wireBytes)
	w.varint(uint64(len(b)))
	w.b = append(w.b, b...)
}

func (w *protoWriter) message(field int, b []byte) { w.bytes(field, b) }

// packed writes a repeated scalar field in packed form.
func (w *protoWriter) packed(field int, xs []uint64) {
	var p protoWriter
	for _, x := range xs {
		p.varint(x)
	}
	w.bytes(field, p.b)
}
