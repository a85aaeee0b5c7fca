package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Handler serves the console as reached at addr, the address it listens
// on: the Host header must name it (or one of Config.Hosts).
func (c *Console) Handler(addr *net.TCPAddr) http.Handler {
	hosts := allowedHosts(addr, c.cfg.Hosts)
	mux := c.routes()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		if !hosts.allows(r.Host) {
			// A page of another site that had its name resolve to this
			// address (DNS rebinding) would send its own name.
			c.log.Warn("console: refused a request for a foreign Host", "host", r.Host, "remote", r.RemoteAddr)
			http.Error(w, "421 this console does not answer to the host name "+r.Host+
				" (amqpretry console --host NAME allows a further name)", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Serve serves the console on ln until ctx ends, then shuts the server down
// (waiting for running requests up to 10 seconds) and returns nil.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("console: listen on a TCP address, not %s", ln.Addr())
	}
	c.setBase(ctx)
	srv := &http.Server{
		Handler:           c.Handler(addr),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	if serveErr := <-done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}
