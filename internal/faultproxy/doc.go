// Package faultproxy is a TCP proxy for tests that puts faults between the
// library and the broker: point a client at Proxy.URL and call CutAll,
// Refuse, Blackhole or SetLatency while it runs.
package faultproxy
