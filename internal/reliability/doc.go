// Package reliability proves that no message is lost when things go wrong:
// cut connections, a broker that hangs or restarts, a process killed mid-wait,
// TLS misconfiguration, leaked secrets (junk input is fuzzed in the packages
// that read it). It holds tests only. Tests that restart
// the broker need the disruptive build tag and run alone (make test runs
// them in a phase of their own):
//
//	go test -tags disruptive -run Soak ./internal/reliability
package reliability
