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

# The oldest Go the library supports. `go mod tidy` raises a module's go line
# when it picks a newer dependency (otel past v1.41 needs Go 1.26): the
# gomod check catches that.
GO_FLOOR := 1.24

.PHONY: test demo broker fmt gomod vet staticcheck unit

test: broker fmt gomod vet staticcheck unit

demo: broker
	cd examples && $(GO) run ./quickstart

broker:
	@scripts/broker.sh

fmt:
	@unformatted=$$(find . -name '*.go' -not -path './.bin/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change these files (run gofmt -w):"; echo "$$unformatted"; exit 1; fi

gomod:
	@for m in $(MODULES); do \
	  line=$$(sed -n 's/^go //p' $$m/go.mod); \
	  case "$$line" in $(GO_FLOOR)|$(GO_FLOOR).*) ;; \
	  *) echo "$$m/go.mod says go $$line; the floor is $(GO_FLOOR): pin the dependency that raised it"; exit 1;; esac; \
	done

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
