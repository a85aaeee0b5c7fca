package recoverer

import "sync/atomic"

// An internedString boxes a header value once for as long as it repeats: in
// a flood of one failure, the copies' routing key, queue, error type and
// fault text are the same from one message to the next, and boxing each
// (string to any) was an allocation per header per message. It keeps the
// last value only; safe for concurrent use.
type internedString struct{ last atomic.Value } // always a string

// box returns s as an any, the last one's box when s equals it.
func (c *internedString) box(s string) any {
	if v := c.last.Load(); v != nil && v.(string) == s {
		return v
	}
	v := any(s)
	c.last.Store(v)
	return v
}

// boxBytes is box(string(b)), with no allocation when b equals the last.
func (c *internedString) boxBytes(b []byte) any {
	if v := c.last.Load(); v != nil && v.(string) == string(b) {
		return v
	}
	v := any(string(b))
	c.last.Store(v)
	return v
}
