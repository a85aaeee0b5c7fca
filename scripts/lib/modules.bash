# What the release scripts (setversion.sh, release-check.sh, release.sh,
# tidy.sh) share about the repository's modules. Sourced, not run.

# The modules a release tags, as directories of the repository: the library,
# then the modules that require it. examples/ and bench/ are workspace modules
# too (their requirements follow the release), but are not published.
RELEASED_MODULES=". outbox cmd/amqpretry"

# The oldest Go the modules support (the Makefile's GO_FLOOR).
GO_FLOOR_LINE=1.24.0

# directive FILE KEYWORD: the arguments of every KEYWORD directive of a go.mod
# or go.work file, one per line, whether written in a block or not.
directive() {
  awk -v kw="$2" '
    { sub(/\/\/.*/, "") }
    $1 == kw && $2 == "(" { block = 1; next }
    block && $1 == ")" { block = 0; next }
    block && NF { print; next }
    $1 == kw { sub("^[ \t]*" kw "[ \t]+", ""); print }' "$1"
}

# module_path DIR: the module path in DIR/go.mod.
module_path() { directive "$1/go.mod" module | awk '{ print $1; exit }'; }

# workspace_modules GOWORK: the directories go.work uses, without "./".
workspace_modules() {
  directive "$1" use | awk '{ d = $1; sub(/^\.\//, "", d); sub(/\/$/, "", d); if (d == "") d = "."; print d }'
}

# required_version GOMOD PATH: the version GOMOD requires of PATH, if any.
required_version() { directive "$1" require | awk -v p="$2" '$1 == p { print $2; exit }'; }

# replaced_versions FILE PATH: the versions of PATH that FILE's replace
# directives name ("*" for a replacement of every version).
replaced_versions() {
  directive "$1" replace | awk -v p="$2" '$1 == p { print ($2 == "=>" ? "*" : $2) }'
}

# tag_of DIR VERSION: the tag a released module's version has.
tag_of() { if [ "$1" = . ]; then echo "$2"; else echo "$1/$2"; fi; }

# path_of ROOT DIR: the module path of the module at ROOT/DIR.
path_of() { module_path "$1/$2"; }
