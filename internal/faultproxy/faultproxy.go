package faultproxy

import (
	"crypto/tls"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	refuse    atomic.Bool
	blackhole atomic.Bool
	latency   atomic.Int64 // nanoseconds added before each forwarded write
	accepted  atomic.Int64
	record    atomic.Bool // count the AMQP methods clients send

	methodsMu sync.Mutex
	methods   map[string]int

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	done   chan struct{} // closed by Close

	wg sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return serve(ln, target), nil
}

// StartTLS is Start with TLS on the listening side, terminated by the proxy
// with cfg: an amqps:// endpoint in front of a plain broker.
func StartTLS(target string, cfg *tls.Config) (*Proxy, error) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		return nil, err
	}
	return serve(ln, target), nil
}

func serve(ln net.Listener, target string) *Proxy {
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns amqpURL with its host and port replaced by the proxy's.
func (p *Proxy) URL(amqpURL string) (string, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", err
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// Accepted counts the connections accepted so far, refused ones included.
func (p *Proxy) Accepted() int { return int(p.accepted.Load()) }

// CutAll closes every open connection, as a crashed broker or a reset
// network would.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Refuse makes new connections close at once (true) or go through (false).
func (p *Proxy) Refuse(on bool) { p.refuse.Store(on) }

// Blackhole stops all traffic in both directions without closing anything
// (true), as a broker that hangs or a partitioned network would: the proxy
// stops reading, so the peers' writes back up in TCP buffers. Turning it off
// delivers what was held, in order, as a healed partition would.
func (p *Proxy) Blackhole(on bool) { p.blackhole.Store(on) }

// SetLatency delays every forwarded chunk by d.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.accepted.Add(1)
		if p.refuse.Load() {
			_ = client.Close()
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			_ = client.Close()
			_ = server.Close()
			return // accepted while closing
		}
		var tap func([]byte)
		if p.record.Load() {
			tap = (&methodReader{count: p.countMethod}).feed
		}
		p.wg.Add(2)
		go p.pipe(server, client, tap)
		go p.pipe(client, server, nil)
	}
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// pipe copies src to dst until either side closes, then closes both so the
// other direction ends too.
// tap, if not nil, sees every chunk before it is forwarded.
func (p *Proxy) pipe(dst, src net.Conn, tap func([]byte)) {
	defer p.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		p.untrack(src)
		p.untrack(dst)
	}()
	buf := make([]byte, 32*1024)
	for {
		if !p.holdWhileBlackholed() {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.holdWhileBlackholed() {
				return
			}
			if tap != nil {
				tap(buf[:n])
			}
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, or the other side closed
		}
	}
}

// holdWhileBlackholed waits while the black hole is on; false when the proxy
// closes meanwhile.
func (p *Proxy) holdWhileBlackholed() bool {
	for p.blackhole.Load() {
		select {
		case <-p.done:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return true
}
