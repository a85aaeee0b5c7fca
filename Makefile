# The two commands a newcomer needs:
#   make demo   run examples/quickstart against the local broker (started if needed)
#   make test   everything CI runs: formatting, the go.mod files, the release
#               check (what a release would publish resolves outside the
#               repository), vet, staticcheck, then on RabbitMQ
#               3.10, 4.0 and 4.3 each the tests with -race (the outbox's
#               on PostgreSQL too) and the broker-disrupting reliability suite,
#               the console's browser tests once (headless Chromium, on 3.10),
#               then the cluster tests on a three-node RabbitMQ 4.3 cluster,
#               then a short fuzz of every target
# and, for numbers and long runs:
#   make bench      the benchmark program (bench/): a markdown report, bench/results/
#                   (its outbox section on PostgreSQL too, its retry section on RabbitMQ 4.3)
#   make soak       the long fault-injection soak (200,000 messages)
#   make vulncheck  govulncheck on every module
#   make tidy       go mod tidy in every module (scripts/tidy.sh: go mod tidy ignores
#                   go.work, so it reads our modules from a scratch module proxy)
#   make release-check  the release check alone (scripts/release-check.sh)
#   make suite      the broker-backed suite once, against $$AMQP_URL (and the node
#                   $$AMQPRETRY_RABBITMQCTL reaches): for a broker of your own
#   make rabbit4    make sure the RabbitMQ 4.0 broker answers (scripts/rabbit4.sh)
#   make rabbit43   make sure the RabbitMQ 4.3 broker answers (scripts/rabbit4.sh 4.3)
#   make postgres   make sure PostgreSQL answers at $$DATABASE_URL (scripts/postgres.sh)
#   make test-console  the console's browser tests alone (scripts/chromium.sh installs
#                   Chromium if need be; screenshots in .bin/screenshots)
#   make test-cluster  the cluster tests on a three-node cluster (scripts/cluster.sh),
#                   started for them and removed after; CLUSTER_RABBITMQ=4.0 or 4.3 for 4.x
#   make cluster-up / cluster-down  keep that cluster running between runs, or remove it
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO ?= go
BIN := $(CURDIR)/.bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(BIN)/staticcheck-$(STATICCHECK_VERSION)
# Modules with their own go.mod: the library, programs that use it, the
# outbox/inbox and the CLI (modules of their own so that their database
# driver stays out of the library's go.mod), and the console's browser tests
# (chromedp stays out of the CLI's go.mod), which run once, in test-console,
# not in each broker's suite. go.work uses them all, so every command here
# builds what is checked out; the nested ones require the library (and
# outbox) at the version they are released with, which go.work makes this
# directory (scripts/setversion.sh, scripts/release.sh).
BROWSER_MODULES := cmd/amqpretry/consoletest
MODULES := . examples bench outbox cmd/amqpretry $(BROWSER_MODULES)

# The oldest Go the library supports. `go mod tidy` raises a module's go line
# when it picks a newer dependency (otel past v1.41 needs Go 1.26): the
# gomod check catches that.
GO_FLOOR := 1.24

GOVULNCHECK_VERSION := v1.1.4
GOVULNCHECK := $(BIN)/govulncheck-$(GOVULNCHECK_VERSION)

# Fuzz targets, as package:Target:executions, each about 4 s on a 2-core
# machine. A package of a nested module (./outbox) is fuzzed from that
# module's directory. The budget is a count, not a duration: with -fuzztime 4s, Go's
# fuzz coordinator (before Go 1.27, golang/go#75804) sometimes fails a target
# with "context deadline exceeded" at the deadline though nothing crashed.
FUZZ_TARGETS := ./internal/amqphdr:FuzzReaders:200000 ./internal/amqpurl:FuzzRedact:200000 ./internal/amqpurl:FuzzParse:150000 \
	./internal/amqptable:FuzzNormalize:120000 ./recoverer:FuzzFitFaultText:60000 ./dlx:FuzzHeaders:60000 \
	./cmd/amqpretry:FuzzEscape:20000 ./outbox:FuzzProperties:30000 ./internal/errtree:FuzzAsAgreesWithErrors:50000 ./typed:FuzzHandler:15000 \
	./cmd/amqpretry/internal/console:FuzzNormalize:40000 ./cmd/amqpretry/internal/console:FuzzRef:30000 \
	./internal/framecheck:FuzzRewrite:40000

# The brokers make test runs the suite on: the system's (Debian bookworm's
# 3.10), and RabbitMQ 4.0 (Debian trixie's) and 4.3 (Debian forky's), each in
# a root of its own beside it (scripts/rabbit4.sh).
# Tests reach a broker through $$AMQP_URL and administer it through
# $$AMQPRETRY_RABBITMQCTL, so the same suite runs on either.
URL_3 := amqp://guest:guest@127.0.0.1:5672/
CTL_3 := rabbitmqctl
URL_4 := amqp://guest:guest@127.0.0.1:5673/
CTL_4 := $(CURDIR)/scripts/rabbit4.sh ctl
URL_43 := amqp://guest:guest@127.0.0.1:5674/
CTL_43 := $(CURDIR)/scripts/rabbit4.sh 4.3 ctl

# The PostgreSQL the outbox and inbox tests use (scripts/postgres.sh starts it).
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable

# The phases of one broker share it and one disrupts it: make never runs two
# targets at once (make -j does nothing); make test runs the lanes that do
# not share a broker side by side itself.
.NOTPARALLEL:

.PHONY: test brokercheck chromium test-console release-check tidy demo bench broker postgres rabbit4 rabbit43 suite-4.3 cluster-up cluster-down test-cluster cluster-4.3 fmt gomod vet staticcheck suite suite-3.10 suite-4.0 unit reliability fuzz soak vulncheck

# make test runs three lanes side by side (scripts/lanes.sh), each in order:
# the checks, which need no broker; the 3.10 broker's suite, the console's
# browser tests (on 3.10) and the 4.0 broker's suite; the 4.3 broker's suite
# and the 4.3 cluster. No two lanes share a broker, and each suite stops and
# restarts only its own (the soak), so they cannot disturb each other; they
# share PostgreSQL, where every test has a schema of its own. Most of a
# suite's time is spent waiting on brokers and timers, not on the CPU: side
# by side the lanes take about twelve minutes on two cores, one after the
# other about twenty-five. LANES=serial runs them one after the other.
LANE_CHECKS := checks: release-check vet staticcheck fuzz vulncheck
LANE_3 := 3.10: suite-3.10 test-console suite-4.0
LANE_43 := 4.3: suite-4.3 cluster-4.3
LANES ?= parallel

# What the lanes need is made sure of first, one at a time (installing any of
# them takes the package manager's lock, which two lanes cannot both hold).
test: fmt gomod brokercheck broker postgres rabbit4 rabbit43 chromium
ifeq ($(LANES),serial)
	@$(MAKE) --no-print-directory $(subst checks:,,$(LANE_CHECKS)) $(subst 3.10:,,$(LANE_3)) $(subst 4.3:,,$(LANE_43))
else
	@MAKE='$(MAKE)' scripts/lanes.sh "$(LANE_CHECKS)" "$(LANE_3)" "$(LANE_43)"
endif

# brokercheck (internal/cmd/brokercheck) says whether a broker answers and
# what it is; the scripts build it too, which is a no-op once it is built.
brokercheck:
	@$(GO) build -o $(BIN)/brokercheck ./internal/cmd/brokercheck

demo: broker
	@echo "make demo: examples/quickstart on $$(AMQP_URL=$(URL_3) $(BIN)/brokercheck -describe)"
	cd examples && AMQP_URL=$(URL_3) $(GO) run ./quickstart

# To keep make test within about fifteen minutes on two cores with three
# brokers, the older brokers' suites run the tests with -short (the long
# fault matrices and the broker-independent real-time schedule run on the
# newest broker only), leave out the outbox module (its relay and inbox
# depend on PostgreSQL, not the broker's version; the publisher under them
# is tested on each), run a shorter soak (10,000 messages through the same
# faults) and leave the outbox's end-to-end test to the newest broker.
# make suite on a broker of your own runs everything in full.
OLDER_BROKER := SOAK_MESSAGES=10000 E2E=0 SHORT=-short UNIT_MODULES=". examples bench cmd/amqpretry"

suite-3.10: broker postgres
	@$(MAKE) --no-print-directory suite AMQP_URL="$(URL_3)" AMQPRETRY_RABBITMQCTL="$(CTL_3)" $(OLDER_BROKER)

# The console's browser tests (cmd/amqpretry/consoletest): amqpretry console
# driven in headless Chromium, which scripts/chromium.sh installs (Debian's
# package) if it is missing, on the 3.10 broker, once. With
# AMQPRETRY_REQUIRE_BROWSER=1 a missing browser fails them, as
# AMQPRETRY_REQUIRE_BROKER=1 does a missing broker. Screenshots of the pages
# go to .bin/screenshots.
test-console: broker chromium
	@cd $(BROWSER_MODULES) && AMQP_URL=$(URL_3) AMQPRETRY_RABBITMQCTL="$(CTL_3)" AMQPRETRY_REQUIRE_BROKER=1 AMQPRETRY_REQUIRE_BROWSER=1 \
	  AMQPRETRY_SCREENSHOTS=$(BIN)/screenshots $(GO) test -race -count=1 -timeout 5m ./...

suite-4.0: rabbit4 postgres
	@$(MAKE) --no-print-directory suite AMQP_URL="$(URL_4)" AMQPRETRY_RABBITMQCTL="$(CTL_4)" $(OLDER_BROKER)

suite-4.3: rabbit43 postgres
	@$(MAKE) --no-print-directory suite AMQP_URL="$(URL_43)" AMQPRETRY_RABBITMQCTL="$(CTL_43)"

# The broker-backed suite once, on whichever broker the environment names.
suite: brokercheck
	@echo "== suite on $$(AMQP_URL="$(AMQP_URL)" $(BIN)/brokercheck -describe || echo "$(AMQP_URL), which does not answer")"
	@$(MAKE) --no-print-directory unit reliability

# About twenty minutes (five rounds of each): throughput against raw amqp091-go
# and Watermill, a poison flood, scale-up, the retry schedule, the outbox relay
# against raw confirmed publishing and its commit-to-publish latency (on
# PostgreSQL), a batch handler writing to PostgreSQL against one INSERT per
# message and a raw batched loop, ack coalescing against raw amqp091-go on 3.10
# and 4.3, and on RabbitMQ 4.3 (scripts/rabbit4.sh 4.3, started here) a flood
# of messages that fail twice through its delayed retry, TTL tiers and local
# retries, with the memory of 100,000 messages parked in a delay; without that
# broker the report says its sections were skipped.
# Writes bench/results/. PROFILE=1 also writes a CPU and an allocation profile
# of every throughput and poison-flood run to bench/results/profiles/ (the runs
# are slower for it; the report says so).
bench: broker postgres
	@scripts/rabbit4.sh 4.3 up || echo "make bench: RabbitMQ 4.3 is not running; the bench skips its retry section"
	cd bench && DATABASE_URL='$(DATABASE_URL)' $(GO) run . -out results$(if $(PROFILE), -profile results/profiles)

broker:
	@AMQP_URL=$(URL_3) scripts/broker.sh

postgres:
	@DATABASE_URL='$(DATABASE_URL)' scripts/postgres.sh

rabbit4:
	@scripts/rabbit4.sh up

chromium:
	@scripts/chromium.sh

rabbit43:
	@scripts/rabbit4.sh 4.3 up

# The three-node cluster (scripts/cluster.sh): RabbitMQ 3.10 with
# CLUSTER_RABBITMQ=3, 4.0 with 4.0 (or 4), 4.3 with 4.3 (unset: the one that
# runs, else 3). test-cluster runs the clustertest package, then the
# zero-loss test with a node killed, a node partitioned and a listener process
# killed, and the cluster-vs-one-node throughput, against the single broker of
# the same version (started if need be).
CLUSTER_RABBITMQ ?=

cluster-up:
	@CLUSTER_RABBITMQ=$(CLUSTER_RABBITMQ) scripts/cluster.sh up

cluster-down:
	@scripts/cluster.sh down

# make test's cluster phase: the newest version users run. The same tests
# run on 4.0 with `make test-cluster CLUSTER_RABBITMQ=4.0`, and on 3.10 with
# CLUSTER_RABBITMQ=3, where two 3.10 failover behaviours fail them now and
# then (docs/clusters.md).
cluster-4.3:
	@$(MAKE) --no-print-directory test-cluster CLUSTER_RABBITMQ=4.3

# The cluster goes down however the tests end, also on ^C: it holds three
# nodes' memory and links that nobody else should trip over.
# The single broker is the one of the version that runs, which up settled.
test-cluster:
	@trap 'scripts/cluster.sh down' EXIT; trap 'exit 130' INT TERM; \
	CLUSTER_RABBITMQ=$(CLUSTER_RABBITMQ) scripts/cluster.sh up; \
	case $$(scripts/cluster.sh version) in \
	  4.0) single=rabbit4 url=$(URL_4) ;; 4.3) single=rabbit43 url=$(URL_43) ;; *) single=broker url=$(URL_3) ;; \
	esac; \
	$(MAKE) --no-print-directory $$single; \
	AMQPRETRY_CLUSTER_URLS=$$(scripts/cluster.sh urls) AMQPRETRY_REQUIRE_CLUSTER=1 AMQPRETRY_REQUIRE_BROKER=1 \
	  $(GO) test -race -count=1 -timeout 10m -v ./internal/clustertest; \
	AMQPRETRY_CLUSTER_URLS=$$(scripts/cluster.sh urls) AMQPRETRY_REQUIRE_CLUSTER=1 AMQPRETRY_REQUIRE_BROKER=1 AMQP_URL=$$url \
	  $(GO) test -race -count=1 -tags cluster -timeout 15m -run 'Cluster' -v ./internal/reliability

fmt:
	@unformatted=$$(find . -name '*.go' -not -path './.bin/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change these files (run gofmt -w):"; echo "$$unformatted"; exit 1; fi

gomod:
	@for f in $(addsuffix /go.mod,$(MODULES)) go.work; do \
	  line=$$(sed -n 's/^go //p' $$f); \
	  case "$$line" in $(GO_FLOOR)|$(GO_FLOOR).*) ;; \
	  *) echo "$${f#./} says go $$line; the floor is $(GO_FLOOR): pin the dependency that raised it (go work init writes the toolchain's version)"; exit 1;; esac; \
	  if grep -q '^toolchain ' $$f; then echo "$${f#./} has a toolchain line: remove it, the floor is the go line"; exit 1; fi; \
	done
	@used=$$(source scripts/lib/modules.bash && workspace_modules go.work); \
	for m in $(MODULES); do \
	  grep -qxF "$$m" <<< "$$used" || { echo "go.work does not use $$m: go work use $$m"; exit 1; }; \
	done

# A scratch module proxy of this work tree at the version the modules
# require, then a user's module outside the repository that go gets the
# library and outbox and go installs the CLI from it, with GOWORK=off
# (scripts/release-check.sh; about half a minute).
release-check:
	@scripts/release-check.sh

tidy:
	@scripts/tidy.sh

vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done
	@$(GO) vet -tags disruptive ./internal/reliability
	@$(GO) vet -tags cluster ./internal/reliability
	@cd outbox && $(GO) vet -tags disruptive ./internal/e2e

$(STATICCHECK):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@mv $(BIN)/staticcheck $@

staticcheck: $(STATICCHECK)
	@for m in $(MODULES); do (cd $$m && $(STATICCHECK) ./...); done
	@$(STATICCHECK) -tags disruptive ./internal/reliability
	@$(STATICCHECK) -tags cluster ./internal/reliability
	@cd outbox && $(STATICCHECK) -tags disruptive ./internal/e2e

# AMQPRETRY_REQUIRE_BROKER=1 and AMQPRETRY_REQUIRE_DB=1: a test that needs the
# broker or PostgreSQL fails instead of skipping.
# unit and reliability use the broker $$AMQP_URL names: run them through suite.
SHORT ?=
# Tests marked t.Parallel wait on the broker and on timers far more than they
# use the CPU (each has its own queues, connections and proxies): six at a
# time rather than one per core.
PARALLEL ?= 6
UNIT_MODULES ?= $(filter-out $(BROWSER_MODULES),$(MODULES))
unit:
	@for m in $(UNIT_MODULES); do (cd $$m && AMQPRETRY_REQUIRE_BROKER=1 AMQPRETRY_REQUIRE_DB=1 DATABASE_URL='$(DATABASE_URL)' \
	  $(GO) test -race -count=1 -parallel $(PARALLEL) $(SHORT) ./...); done

# Tests that stop the broker's app run alone, after the others: a restart
# would pull the broker from under tests running in parallel. The outbox's
# end-to-end test (20,000 orders through a killed relay process, a restarted
# broker and the inbox, about a minute) needs PostgreSQL too.
SOAK_MESSAGES ?= 20000
E2E ?= 1
reliability:
	@AMQPRETRY_REQUIRE_BROKER=1 AMQPRETRY_SOAK_MESSAGES=$(SOAK_MESSAGES) $(GO) test -race -count=1 -tags disruptive -timeout 8m -run 'Soak' -v ./internal/reliability | grep -E '^(---|===|ok|FAIL|PASS)|soak_test' || (echo "reliability suite failed on $(AMQP_URL)"; exit 1)
	@if [ "$(E2E)" = 1 ]; then cd outbox && AMQPRETRY_REQUIRE_BROKER=1 AMQPRETRY_REQUIRE_DB=1 DATABASE_URL='$(DATABASE_URL)' $(GO) test -race -count=1 -tags disruptive -timeout 5m -run 'OutboxEndToEnd' -v ./internal/e2e | grep -E '^(---|===|ok|FAIL|PASS)|e2e_test' || (echo "outbox end-to-end test failed on $(AMQP_URL)"; exit 1); \
	else echo "outbox end-to-end test: on the newest broker only (make suite runs it here: E2E=1)"; fi

fuzz:
	@log=$$(mktemp); marker=$$(mktemp); trap 'rm -f $$log $$marker' EXIT; \
	for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; execs=$${rest#*:}; \
	  mod=$$pkg; while [ ! -f $$mod/go.mod ]; do mod=$$(dirname $$mod); done; rel=$${pkg#$$mod}; \
	  touch $$marker; start=$$(date +%s); \
	  if ! (cd $$mod && $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $${execs}x ./$${rel#/}) > $$log 2>&1; then \
	    cat $$log; \
	    found=$$(find $$pkg/testdata/fuzz/$$name -type f -newer $$marker 2>/dev/null); \
	    if [ -n "$$found" ]; then echo "fuzzing $$name found a failing input: $$found (go test -run '$$name' $$pkg replays it)"; \
	    else echo "fuzzing $$name failed without writing a failing input; see the output above"; fi; \
	    exit 1; \
	  fi; \
	  echo "fuzz $$name: ok ($$execs executions, $$(( $$(date +%s) - start ))s)"; \
	done

# The long soak: 200,000 messages through cut connections and a broker restart.
soak: broker
	AMQPRETRY_REQUIRE_BROKER=1 AMQPRETRY_SOAK_MESSAGES=$${AMQPRETRY_SOAK_MESSAGES:-200000} \
	  $(GO) test -race -count=1 -tags disruptive -timeout 60m -run 'Soak' -v ./internal/reliability

$(GOVULNCHECK):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION)
	@mv $(BIN)/govulncheck $@

# govulncheck needs its database at vuln.go.dev. Where that is unreachable
# (machines whose only registry is the Go module proxy) it says so loudly and
# does not fail the build; everywhere else a finding fails it.
vulncheck: $(GOVULNCHECK)
	@if curl -fsS -m 10 -o /dev/null https://vuln.go.dev/index/db.json 2>/dev/null; then \
	  for m in $(MODULES); do (cd $$m && $(GOVULNCHECK) ./...) || exit 1; done; \
	else \
	  echo "vulncheck: NOT RUN - the vulnerability database (https://vuln.go.dev) is unreachable from this machine"; \
	fi
