package main

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"
)

// brokerPID finds the process listening on the URL's port: here, this test
// itself, listening on a loopback port of its own.
func TestBrokerPIDFindsTheListeningProcess(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network]
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("no %s loopback here: %v", network, err) // IPv6 may be off; tcp4 always runs
			}
			defer ln.Close()
			port := ln.Addr().(*net.TCPAddr).Port
			host := map[string]string{"tcp4": "127.0.0.1", "tcp6": "[::1]"}[network]
			if got := brokerPID(fmt.Sprintf("amqp://guest:guest@%s:%d/", host, port)); got != os.Getpid() {
				t.Errorf("brokerPID = %d, want this process, %d", got, os.Getpid())
			}
			if network == "tcp4" {
				if got := brokerPID(fmt.Sprintf("amqp://localhost:%d/", port)); got != os.Getpid() {
					t.Errorf("brokerPID with localhost = %d, want %d", got, os.Getpid())
				}
			}
		})
	}
}

func TestBrokerPIDIsZeroWhenItCannotKnow(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	for _, url := range []string{
		fmt.Sprintf("amqp://127.0.0.1:%d/", port), // nothing listens there now
		"amqp://rabbit.example.com:5672/",         // another machine
		"amqp://10.1.2.3:5672/",
		"::not a url",
	} {
		if got := brokerPID(url); got != 0 {
			t.Errorf("brokerPID(%q) = %d, want 0", url, got)
		}
	}
}

// processCPU agrees with getrusage about this process, to within the
// 10 ms ticks of /proc. The spin is measured in CPU, not wall time, so a
// loaded machine only makes it longer.
func TestProcessCPUMeasuresAProcess(t *testing.T) {
	rusage0 := cpuTime()
	before, ok := processCPU(os.Getpid())
	if !ok {
		t.Fatal("cannot read this process's own CPU time from /proc")
	}
	for cpuTime()-rusage0 < 150*time.Millisecond {
	}
	after, _ := processCPU(os.Getpid())
	rusage := cpuTime() - rusage0
	if d := after - before; d < rusage-30*time.Millisecond || d > rusage+30*time.Millisecond {
		t.Errorf("/proc says %v of CPU went by, getrusage %v", d, rusage)
	}
	if _, ok := processCPU(0); ok {
		t.Error("processCPU(0) claims to know")
	}
}
