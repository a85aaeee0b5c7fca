// Command brokercheck exits 0 when an AMQP broker accepts a connection at
// $AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), 1 when it does not,
// and 2 when the URL is invalid. scripts/broker.sh uses it.
//
//	brokercheck [-timeout 3s] [-quiet]   dial and log in
//	brokercheck -loopback                exit 0 if the URL's host is this machine
//	brokercheck -describe                print which broker answers: "RabbitMQ 4.0.5 at amqp://..."
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpurl"
)

func main() {
	timeout := flag.Duration("timeout", 3*time.Second, "how long to wait for the connection")
	quiet := flag.Bool("quiet", false, "print nothing when the broker does not answer")
	loopback := flag.Bool("loopback", false, "only report whether the URL's host is this machine")
	describe := flag.Bool("describe", false, "print the broker's product and version and its URL, password hidden")
	flag.Parse()

	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = amqpurl.Default
	}
	uri, err := amqpurl.Parse(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "brokercheck:", err)
		os.Exit(2)
	}
	if *loopback {
		if amqpurl.IsLoopback(uri) {
			os.Exit(0)
		}
		os.Exit(1)
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(*timeout)})
	if err != nil {
		if !*quiet {
			fmt.Fprintf(os.Stderr, "brokercheck: no AMQP broker at %s: %v\n", amqpurl.Redact(url), err)
		}
		os.Exit(1)
	}
	defer conn.Close()
	if *describe {
		fmt.Printf("%v %v at %s\n", conn.Properties["product"], conn.Properties["version"], amqpurl.Redact(url))
	}
}
