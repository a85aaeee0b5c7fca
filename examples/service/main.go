// Command service is the shape of a Go service that consumes RabbitMQ with
// amqpretry: configuration from the environment, two queues on one
// connection (a listener Group) and a publisher, dead letters on a DLQ per
// queue, a health endpoint a Kubernetes probe can read, and a shutdown in
// order on SIGTERM or SIGINT.
//
//	AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ HTTP_ADDR=127.0.0.1:8080 go run ./service
//	curl -s 127.0.0.1:8080/readyz; curl -s 127.0.0.1:8080/stats
//
// Environment: AMQP_URL (required), HTTP_ADDR (default 127.0.0.1:8080),
// QUEUE_PREFIX (default "service"), SHUTDOWN_TIMEOUT (default 20s, a Go
// duration: keep it under the pod's terminationGracePeriodSeconds).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Getenv, logger, nil); err != nil {
		logger.Error("service: stopped", "error", err)
		os.Exit(1)
	}
}

// config is the service's configuration, from the environment.
type config struct {
	amqpURL, httpAddr, prefix string
	shutdownTimeout           time.Duration
}

func configFrom(getenv func(string) string) (config, error) {
	c := config{amqpURL: getenv("AMQP_URL"), httpAddr: getenv("HTTP_ADDR"), prefix: getenv("QUEUE_PREFIX"), shutdownTimeout: 20 * time.Second}
	if c.amqpURL == "" {
		return c, errors.New("AMQP_URL is required, e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if c.httpAddr == "" {
		c.httpAddr = "127.0.0.1:8080"
	}
	if c.prefix == "" {
		c.prefix = "service"
	}
	if s := getenv("SHUTDOWN_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("SHUTDOWN_TIMEOUT: want a duration such as 20s, got %q", s)
		}
		c.shutdownTimeout = d
	}
	return c, nil
}

// run is the service until ctx ends. ready, if not nil, is told the HTTP
// address once the listeners consume.
func run(ctx context.Context, getenv func(string) string, logger *slog.Logger, ready func(addr string)) error {
	cfg, err := configFrom(getenv)
	if err != nil {
		return err
	}
	pub, err := publisher.New(cfg.amqpURL, publisher.WithLogger(logger))
	if err != nil {
		return err // the broker must answer at start-up: fail, and be restarted
	}
	defer pub.Close() // last: the listeners' recoverers publish through it

	orders := dlx.Topology{Queue: cfg.prefix + ".orders", Type: dlx.Quorum}
	refunds := dlx.Topology{Queue: cfg.prefix + ".refunds", Type: dlx.Quorum}
	var listeners []*listener.Listener
	for _, q := range []struct {
		topo   dlx.Topology
		handle middleware.Handler
	}{{orders, handleOrder}, {refunds, handleRefund}} {
		chain := middleware.Chain(
			middleware.Retry(3, middleware.WithInitialInterval(100*time.Millisecond)),
			middleware.Recover(recoverer.Republish(pub, q.topo.DLX(), q.topo.DLQRoutingKey())),
		)
		l, err := listener.New(q.topo.Queue, chain, q.handle, listener.WithDeclare(q.topo.Declare),
			listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(8),
			listener.WithShutdownTimeout(cfg.shutdownTimeout), listener.WithLogger(logger))
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
	}
	group, err := listener.NewGroup(listeners, listener.WithURL(cfg.amqpURL), listener.WithFailFast(),
		listener.WithConnectionName("service"), listener.WithLogger(logger))
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.httpAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: health(listeners), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	consumed := make(chan error, 1)
	go func() { consumed <- group.Run(ctx) }()
	if ready != nil {
		go func() {
			if group.WaitReady(ctx) == nil {
				ready(ln.Addr().String())
			}
		}()
	}
	logger.Info("service: started", "http", ln.Addr().String(), "queues", []string{orders.Queue, refunds.Queue})

	// Shutdown in order: the listeners finish what they hold (Run returns
	// when ctx ends, or at once with a fatal error), then the HTTP server
	// stops, then the publisher closes (deferred).
	err = <-consumed
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	logger.Info("service: stopped")
	return err
}

// health serves /livez (the process runs), /readyz (every listener
// consumes: 503 otherwise, e.g. while the broker is away) and /stats (each
// listener's Stats as JSON, dead letters included).
func health(listeners []*listener.Listener) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, l := range listeners {
			if s := l.Stats(); !s.Ready {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "not consuming: %s\n", s.LastConnectionError)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		type queueStats struct {
			Queue string `json:"queue"`
			listener.Stats
		}
		var out []queueStats
		for _, l := range listeners {
			out = append(out, queueStats{Queue: l.Queue(), Stats: l.Stats()})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	return mux
}

// An order is JSON; one that does not decode can never succeed: Permanent,
// straight to the DLQ.
func handleOrder(_ context.Context, d *amqp.Delivery) error {
	var order struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(d.Body, &order); err != nil {
		return middleware.Permanent(fmt.Errorf("decode order: %w", err))
	}
	return nil // store it, call a service, ...
}

func handleRefund(_ context.Context, d *amqp.Delivery) error {
	if len(d.Body) == 0 {
		return middleware.Permanent(errors.New("an empty refund"))
	}
	return nil
}
