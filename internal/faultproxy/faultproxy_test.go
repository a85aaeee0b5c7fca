package faultproxy_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxyFaults(t *testing.T) {
	p, err := faultproxy.Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, time.Second); err != nil || got != "ping\n" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	p.Blackhole(true)
	if _, err := roundTrip(c, 300*time.Millisecond); err == nil {
		t.Fatal("black hole: the reply came through")
	}
	p.Blackhole(false)
	// The held request reaches the server once the partition heals, and its
	// reply arrives intact.
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("after the black hole: %q, %v; want the held reply", got, err)
	}

	p.SetLatency(200 * time.Millisecond)
	c2, _ := net.Dial("tcp", p.Addr())
	defer c2.Close()
	start := time.Now()
	if _, err := roundTrip(c2, 2*time.Second); err != nil || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("latency: %v after %v, want ≥ 400ms for two hops", err, time.Since(start))
	}
	p.SetLatency(0)

	p.CutAll()
	if _, err := roundTrip(c2, time.Second); err == nil {
		t.Fatal("cut: the connection still works")
	}

	p.Refuse(true)
	c3, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c3.Close()
		if _, err := roundTrip(c3, time.Second); err == nil {
			t.Fatal("refuse: a new connection works")
		}
	}
}
