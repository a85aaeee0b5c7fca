# The two commands a newcomer needs:
#   make demo   run examples/quickstart against the local broker (started if needed)
#   make test   everything CI runs: formatting, vet, staticcheck, tests with -race
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO ?= go
BIN := $(CURDIR)/.bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(BIN)/staticcheck-$(STATICCHECK_VERSION)
# Modules with their own go.mod: the library, then programs that use it.
MODULES := . examples

.PHONY: test demo broker fmt vet staticcheck unit

test: broker fmt vet staticcheck unit

demo: broker
	cd examples && $(GO) run ./quickstart

broker:
	@scripts/broker.sh

fmt:
	@unformatted=$$(find . -name '*.go' -not -path './.bin/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change these files (run gofmt -w):"; echo "$$unformatted"; exit 1; fi

vet:
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

$(STATICCHECK):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@mv $(BIN)/staticcheck $@

staticcheck: $(STATICCHECK)
	@for m in $(MODULES); do (cd $$m && $(STATICCHECK) ./...); done

# AMQPRETRY_REQUIRE_BROKER=1: a test that needs the broker fails instead of skipping.
unit:
	@for m in $(MODULES); do (cd $$m && AMQPRETRY_REQUIRE_BROKER=1 $(GO) test -race -count=1 ./...); done
