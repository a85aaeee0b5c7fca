package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The broker shares the machine's cores with the client, so a variant that
// makes the broker work harder per message (bigger messages, more frames)
// lowers everyone's msg/s without showing in the client's CPU. When the
// broker runs on this machine and its process can be found, every sample
// also records the broker's CPU per message.

// clockTicks is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// brokerPID finds the process listening on the broker URL's port when the
// URL names this machine: from the listening socket's inode in
// /proc/net/tcp{,6} to the process holding it. It returns 0 when the broker
// is elsewhere or the process cannot be seen (another user's, no /proc).
func brokerPID(rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5672"
	}
	if ip := net.ParseIP(host); !(host == "localhost" || ip != nil && ip.IsLoopback()) {
		return 0
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0
	}
	inodes := listeningInodes(uint16(p))
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// listeningInodes returns the inodes of the TCP sockets listening on port.
func listeningInodes(port uint16) map[string]bool {
	inodes := map[string]bool{}
	suffix := fmt.Sprintf(":%04X", port)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], suffix) {
				continue
			}
			inodes[f[9]] = true
		}
	}
	return inodes
}

// processCPU is the user+system CPU time of process pid so far, from
// /proc/<pid>/stat; false when it cannot be read.
func processCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: count fields after it.
	// utime and stime are fields 14 and 15 of the line, 12 and 13 after ")".
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// cpuMark is where a measured run starts: this process's CPU time, and the
// broker's when it is known.
type cpuMark struct {
	self      time.Duration
	broker    time.Duration
	brokerPID int // 0: not measured
}

// cpuMark notes the CPU times now.
func (e *env) cpuMark() cpuMark {
	m := cpuMark{self: cpuTime()}
	if b, ok := processCPU(e.brokerPID); ok {
		m.broker, m.brokerPID = b, e.brokerPID
	}
	return m
}

// brokerCPUSince is the broker's CPU time since m, and whether it is known.
func (m cpuMark) brokerCPUSince() (time.Duration, bool) {
	b, ok := processCPU(m.brokerPID)
	if !ok {
		return 0, false
	}
	return b - m.broker, true
}
