#!/usr/bin/env bash
# Install fabricmon on a systemd host (as root): a venv under --prefix built with a Python 3.10 or newer,
# the systemd units written for that prefix, the example configs and a token.  Supported systems and
# the command for each: docs/install.md (Debian 12, Ubuntu 22.04/24.04, DGX OS 6, Rocky 9).
#
#   scripts/install.sh                       # agent and aggregator, venv in /opt/fabricmon
#   scripts/install.sh --role agent          # agent nodes (no numpy)
#   scripts/install.sh --uninstall           # remove the venv and the units; configs, token, state stay
#   scripts/install.sh --uninstall --purge   # also the configs, the token and the state directories
#   scripts/install.sh --check-config        # check-config the installed configs (after editing them)
#
# Options (defaults in brackets):
#   --prefix DIR      the venv [/opt/fabricmon]; the units run DIR/bin/fabricmon
#   --role ROLE       agent | aggregator | both [both]
#   --wheel FILE      install this wheel instead of building one from this checkout
#   --token-file FILE copy this token to SYSCONFDIR/fabricmon/token (else one is generated if none is there)
#   --sysconfdir DIR  configs go to DIR/fabricmon, EnvironmentFiles to DIR/default [/etc]
#   --unitdir DIR     where the units go [/etc/systemd/system]
#   --statedir DIR    where the units' StateDirectory lives, for --purge [/var/lib]
#   --python PATH     the Python (3.10 or newer) the venv is built with [the first of python3.12,
#                     python3.11, python3.10, python3 on PATH that is 3.10 or newer]
#   --install-deps    install what the venv needs (venv/ensurepip) and, for the agent, infiniband-diags
#                     (the switch sweep's tools, sources.ib_switches) with the distribution's own tool:
#                     apt-get (Debian, Ubuntu, DGX OS) or dnf (Rocky, RHEL); without it nothing is
#                     installed and a missing piece is named with the command that installs it
#   --no-apt          accepted for older scripts; does nothing (packages are only installed with --install-deps)
#
# Paths are written into the units and configs as they are: --prefix, --sysconfdir and --unitdir may
# hold only letters, digits and . _ + @ - / (a space, %, $, & or a quote would change what systemd or
# sed reads); anything else is refused before anything is written.  The written units are checked with
# `systemd-analyze verify` where it is installed; a complaint about them fails the install.
#
# Nothing is enabled or started: the script prints the systemctl commands.  Configs and the token
# already in place are never overwritten (the new example is written beside them as *.dist).
# Everything written outside the prefix is listed in PREFIX/share/fabricmon/installed-files,
# which --uninstall reads, so it removes only what this script wrote.
set -euo pipefail

PREFIX=/opt/fabricmon
ROLE=both
WHEEL=""
TOKEN_SRC=""
SYSCONFDIR=/etc
UNITDIR=/etc/systemd/system
STATEDIR=/var/lib
ACTION=install
PURGE=0
PYTHON=""
DEPS=0
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() { echo "install.sh: error: $*" >&2; exit 2; }
note() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=${2:?}; shift 2 ;;
    --role) ROLE=${2:?}; shift 2 ;;
    --wheel) WHEEL=${2:?}; shift 2 ;;
    --token-file) TOKEN_SRC=${2:?}; shift 2 ;;
    --sysconfdir) SYSCONFDIR=${2:?}; shift 2 ;;
    --unitdir) UNITDIR=${2:?}; shift 2 ;;
    --statedir) STATEDIR=${2:?}; shift 2 ;;
    --uninstall) ACTION=uninstall; shift ;;
    --check-config) ACTION=check; shift ;;
    --purge) PURGE=1; shift ;;
    --python) PYTHON=${2:?}; shift 2 ;;
    --install-deps) DEPS=1; shift ;;
    --no-apt) shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option: $1 (see --help)" ;;
  esac
done
case "$ROLE" in agent) ROLES=(agent) ;; aggregator) ROLES=(aggregator) ;; both) ROLES=(agent aggregator) ;;
  *) die "--role: $ROLE is not agent, aggregator or both" ;; esac
[ "$PURGE" -eq 0 ] || [ "$ACTION" = uninstall ] || die "--purge goes with --uninstall"
[ "$(id -u)" -eq 0 ] || die "run as root (the units and configs go to system directories)"
case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path (the units name it)" ;; esac
for d in "$SYSCONFDIR" "$UNITDIR" "$STATEDIR"; do case "$d" in /*) ;; *) die "$d: not an absolute path" ;; esac; done
# What goes into a unit unquoted: systemd splits ExecStart= at spaces and expands % and $, and the
# templates are rewritten with sed (& and # there are its own).  Refused rather than escaped: the same
# path also lands in YAML configs and EnvironmentFiles, each with its own quoting.
for opt in "--prefix=$PREFIX" "--sysconfdir=$SYSCONFDIR" "--unitdir=$UNITDIR" "--statedir=$STATEDIR"; do
  v=${opt#*=}
  [[ "$v" =~ ^[A-Za-z0-9._+@/-]+$ ]] \
    || die "${opt%%=*} '$v': only letters, digits and . _ + @ - / can be written into a systemd unit"
done

CONF="$SYSCONFDIR/fabricmon"
MANIFEST="$PREFIX/share/fabricmon/installed-files"
MARKER="$PREFIX/share/fabricmon/installed-by"
systemd_running() { [ -d /run/systemd/system ] && [ "$UNITDIR" = /etc/systemd/system ]; }

# check-config on the installed configs.  A config kept from before 0.2.0 names the token where
# LoadCredential= put it (/run/credentials/<unit>/token), which the units no longer make: refused by
# name.  Each config is checked as a copy beside the original, so paths relative to it resolve the same.
check_configs() {
  for r in "${ROLES[@]}"; do
    ! grep -q "^[^#]*/run/credentials/" "$CONF/$r.yaml" || die "$CONF/$r.yaml: token_file names" \
      "/run/credentials/, which the units no longer make (a rotated token never reached it): set it to $CONF/token"
    check="$CONF/.check-config-$r.yaml"
    cp -- "$CONF/$r.yaml" "$check"
    # Its messages name the copy: shown with the installed file's name.
    if ! "$PREFIX/bin/fabricmon" check-config --kind "$r" "$check" 2> "$check.err" >/dev/null; then
      sed "s#$check#$CONF/$r.yaml#g" "$check.err" >&2
      rm -f -- "$check" "$check.err"
      die "$CONF/$r.yaml does not pass check-config (above); fix it, then rerun"
    fi
    sed "s#$check#$CONF/$r.yaml#g" "$check.err" >&2
    rm -f -- "$check" "$check.err"
  done
  [ "$ROLE" = agent ] || "$PREFIX/bin/fabricmon" check-config --kind topology "$CONF/topology.yaml" >/dev/null \
    || die "$CONF/topology.yaml does not pass check-config (above)"
}

# ------------------------------------------------------------------ uninstall

if [ "$ACTION" = uninstall ]; then
  [ -f "$MARKER" ] || [ "$PURGE" -eq 1 ] || die "$PREFIX: no fabricmon installed by this script (no $MARKER)"
  if systemd_running; then
    for r in agent aggregator; do
      systemctl disable --now "fabricmon-$r.service" >/dev/null 2>&1 || true
    done
  fi
  # What `systemctl enable` linked (also when it ran without a running systemd, as in a chroot).
  for r in agent aggregator; do
    find "$UNITDIR" -mindepth 2 -maxdepth 2 -path "*.wants/fabricmon-$r.service" -type l -delete 2>/dev/null || true
  done
  if [ -f "$MARKER" ]; then
    # Units and *.dist examples as listed; configs, the token and EnvironmentFiles are the
    # operator's from the moment they are installed: only --purge removes them.
    while IFS= read -r f; do
      case "$f" in unit:*|doc:*) rm -f -- "${f#*:}" ;; esac
    done < "$MANIFEST"
    rm -rf -- "$PREFIX"
  fi
  if [ "$PURGE" -eq 1 ]; then
    for r in agent aggregator; do
      rm -f -- "$CONF/$r.yaml" "$CONF/$r.yaml.dist" "$SYSCONFDIR/default/fabricmon-$r" \
        "$SYSCONFDIR/default/fabricmon-$r.dist"
      # DynamicUser= keeps the data under private/ behind a symlink.
      rm -rf -- "$STATEDIR/fabricmon-$r" "$STATEDIR/private/fabricmon-$r"
    done
    rm -f -- "$CONF/topology.yaml" "$CONF/topology.yaml.dist" "$CONF/token"
    ! getent group fabricmon >/dev/null || groupdel fabricmon
    rmdir -- "$CONF" 2>/dev/null || note "kept $CONF: it holds files this script did not write"
  fi
  ! systemd_running || systemctl daemon-reload
  if [ "$PURGE" -eq 1 ]; then note "removed $PREFIX, the units, configs, token and state"
  else note "removed $PREFIX and the units; configs and token stay in $CONF (--purge removes them)"; fi
  exit 0
fi

if [ "$ACTION" = check ]; then
  [ -x "$PREFIX/bin/fabricmon" ] || die "$PREFIX: fabricmon is not installed there"
  ROLES=()
  for r in agent aggregator; do [ ! -f "$CONF/$r.yaml" ] || ROLES+=("$r"); done
  [ ${#ROLES[@]} -gt 0 ] || die "$CONF: no agent.yaml or aggregator.yaml"
  [ ! -f "$CONF/aggregator.yaml" ] || ROLE=both
  [ -f "$CONF/aggregator.yaml" ] || ROLE=agent
  check_configs
  note "check-config: ${ROLES[*]}$([ "$ROLE" = agent ] || echo " topology") in $CONF ok"
  exit 0
fi

# ------------------------------------------------------------------ install

# The distribution's package tool, and the packages a Python needs to build a venv with pip
# (Debian and Ubuntu split ensurepip into python3-venv / python3.X-venv; Rocky's python3.X has it).
pkg_tool() { if command -v apt-get >/dev/null; then echo apt; elif command -v dnf >/dev/null; then echo dnf; fi; }
py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }
if [ -n "$PYTHON" ]; then
  [ -x "$PYTHON" ] || PYTHON=$(command -v "$PYTHON" 2>/dev/null) || die "--python: not found or not executable"
  py_ok "$PYTHON" || die "--python $PYTHON: $("$PYTHON" -V 2>&1 || echo "does not run"): fabricmon needs 3.10 or newer"
else
  for c in python3.12 python3.11 python3.10 python3; do
    p=$(command -v "$c" 2>/dev/null) && py_ok "$p" && { PYTHON=$p; break; }
  done
  if [ -z "$PYTHON" ]; then
    case "$(pkg_tool)" in
      dnf) hint="dnf install python3.11 (Rocky/RHEL 8 and 9), then rerun, or --install-deps" ;;
      apt) hint="apt-get install python3 python3-venv, then rerun, or --install-deps" ;;
      *) hint="install one, then rerun with --python PATH" ;;
    esac
    [ "$DEPS" -eq 1 ] && [ "$(pkg_tool)" = dnf ] || die "no Python 3.10 or newer (python3.12, python3.11, python3.10, python3): $hint"
    note "installing python3.11 (dnf)"
    dnf install -y -q python3.11 >/dev/null
    PYTHON=$(command -v python3.11) || die "dnf installed python3.11 but it is not on PATH"
  fi
fi
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
note "building the venv with $PYTHON (Python $pyver)"
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  # Debian's python3 takes python3-venv; a versioned python3.X (Ubuntu, deadsnakes) takes python3.X-venv.
  base=$(basename "$PYTHON")
  case "$base" in python3) pkg=python3-venv ;; *) pkg=$base-venv ;; esac
  case "$(pkg_tool)" in
    apt) cmd="apt-get install $pkg" ;;
    dnf) cmd="dnf install $base" ;;
    *) cmd="your distribution's venv/ensurepip package" ;;
  esac
  [ "$DEPS" -eq 1 ] && [ -n "$(pkg_tool)" ] || die "$PYTHON cannot make a venv with pip (no ensurepip): $cmd, or rerun with --install-deps"
  note "installing: $cmd"
  if [ "$(pkg_tool)" = apt ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
  else
    dnf install -y -q "$base" >/dev/null
  fi
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || die "$PYTHON still has no ensurepip after: $cmd"
fi

# The agent's switch sweep (sources.ib_switches, enabled on one node per plane: docs/operations.md) runs
# infiniband-diags (ibnetdiscover, iblinkinfo, perfquery, smpquery): the same package name on both
# families (Debian's infiniband-diags; RHEL/Rocky build it from rdma-core).  Off by default, so without
# --install-deps a missing tool is a note, not a failure.
SWEEP_TOOLS=(ibnetdiscover iblinkinfo perfquery smpquery)
SWEEP_PACKAGES_APT=(infiniband-diags)
SWEEP_PACKAGES_DNF=(infiniband-diags)
if [ "$ROLE" != aggregator ]; then
  missing=()
  for t in "${SWEEP_TOOLS[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    case "$(pkg_tool)" in
      apt) pkgs=("${SWEEP_PACKAGES_APT[@]}"); cmd="apt-get install ${pkgs[*]}" ;;
      dnf) pkgs=("${SWEEP_PACKAGES_DNF[@]}"); cmd="dnf install ${pkgs[*]}" ;;
      *) pkgs=(); cmd="your distribution's infiniband-diags" ;;
    esac
    if [ "$DEPS" -eq 1 ] && [ "${#pkgs[@]}" -gt 0 ]; then
      note "installing: $cmd (the switch sweep's tools)"
      if [ "$(pkg_tool)" = apt ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
      else
        dnf install -y -q "${pkgs[@]}" >/dev/null
      fi
    else
      note "not installed: ${missing[*]} (needed only where sources.ib_switches is enabled): $cmd, or --install-deps"
    fi
  fi
fi

if [ -e "$PREFIX" ] && [ ! -f "$MARKER" ]; then
  [ -z "$(ls -A "$PREFIX" 2>/dev/null)" ] || die "$PREFIX exists and was not made by this script: choose another --prefix"
fi
"$PYTHON" -m venv "$PREFIX"
PIP=("$PREFIX/bin/python" -m pip --disable-pip-version-check -q)
mkdir -p "$PREFIX/share/fabricmon"
: > "$MANIFEST.new"

work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
if [ -z "$WHEEL" ]; then
  note "building the wheel from $SRC"
  "${PIP[@]}" wheel --no-deps -w "$work" "$SRC"
  WHEEL=$(ls "$work"/fabricmon-*.whl)
fi
[ -f "$WHEEL" ] || die "--wheel: $WHEEL: no such file"
extra=""
[ "$ROLE" = agent ] || extra="[aggregator]"
# The locked, hash-checked dependencies first where this checkout has them, then fabricmon itself
# without resolving anything more (the Containerfile does the same).
# requirements/py3.X/ holds the locks of a Python whose resolution differs (scripts/lock.sh).
lockdir="$SRC/requirements"
[ ! -d "$lockdir/py$pyver" ] || lockdir="$lockdir/py$pyver"
lock="$lockdir/$([ "$ROLE" = agent ] && echo agent || echo aggregator).lock"
if [ -f "$lock" ]; then
  "${PIP[@]}" install --require-hashes -r "$lock"
  "${PIP[@]}" install --no-deps "$WHEEL"
else
  "${PIP[@]}" install "$WHEEL$extra"
fi
"$PREFIX/bin/fabricmon" --version >/dev/null

# Write $2 from $1 with the paths of this install, recording it in the manifest as kind $3.
# A config already there is kept and the new one written beside it as .dist.
put() {
  local from=$1 to=$2 kind=$3 mode=$4 tmp
  mkdir -p "$(dirname "$to")"
  tmp=$(mktemp "$to.XXXXXX")
  sed -e "s#/usr/local/bin/fabricmon#$PREFIX/bin/fabricmon#g" \
      -e "s#/etc/fabricmon/#$CONF/#g" \
      -e "s#/etc/default/#$SYSCONFDIR/default/#g" "$from" > "$tmp"
  chmod "$mode" "$tmp"
  if [ "$kind" = config ] && [ -e "$to" ] && ! cmp -s "$tmp" "$to"; then
    mv -f "$tmp" "$to.dist"
    note "kept $to (the new example is $to.dist)"
    echo "doc:$to.dist" >> "$MANIFEST.new"
    return
  fi
  mv -f "$tmp" "$to"
  echo "$kind:$to" >> "$MANIFEST.new"
}

for r in "${ROLES[@]}"; do
  put "$SRC/systemd/fabricmon-$r.service" "$UNITDIR/fabricmon-$r.service" unit 0644
  put "$SRC/systemd/etc/fabricmon/$r.yaml" "$CONF/$r.yaml" config 0644
  put "$SRC/systemd/etc/default/fabricmon-$r" "$SYSCONFDIR/default/fabricmon-$r" config 0644
done
[ "$ROLE" = agent ] || put "$SRC/systemd/etc/fabricmon/topology.yaml" "$CONF/topology.yaml" config 0644

# The token both roles read (the same on every agent and aggregator), in place: root:fabricmon 0640,
# the units' SupplementaryGroups=fabricmon.  Not LoadCredential=: its copy is made at start and never
# refreshed, so a rotated token would not reach the running daemons; they watch this file instead.
getent group fabricmon >/dev/null || groupadd --system fabricmon
if [ -n "$TOKEN_SRC" ]; then
  [ -s "$TOKEN_SRC" ] || die "--token-file: $TOKEN_SRC: missing or empty"
  install -m 0640 -g fabricmon "$TOKEN_SRC" "$CONF/token"
  echo "config:$CONF/token" >> "$MANIFEST.new"
elif [ ! -e "$CONF/token" ]; then
  (umask 077; "$PREFIX/bin/python" -c 'import secrets; print(secrets.token_hex(32))' > "$CONF/token")
  echo "config:$CONF/token" >> "$MANIFEST.new"
  note "generated $CONF/token: copy the same file to every agent and aggregator (or rerun with --token-file)"
fi
chgrp fabricmon "$CONF/token" && chmod 0640 "$CONF/token"  # also a token of an earlier install (0600)

check_configs

# Keep entries of an earlier install that this one did not rewrite (a .dist, a generated token).
if [ -f "$MANIFEST" ]; then sort -u "$MANIFEST" "$MANIFEST.new" > "$MANIFEST.tmp"; else sort -u "$MANIFEST.new" > "$MANIFEST.tmp"; fi
mv -f "$MANIFEST.tmp" "$MANIFEST"
rm -f "$MANIFEST.new"
echo "fabricmon $("$PREFIX/bin/fabricmon" --version | awk '{print $2}') role=$ROLE sysconfdir=$SYSCONFDIR unitdir=$UNITDIR" > "$MARKER"

# The units as systemd will read them: `systemd-analyze verify` exits 0 on an unknown key or a value
# it cannot parse (a warning on stderr), so its stderr is read too.
if command -v systemd-analyze >/dev/null; then
  for r in "${ROLES[@]}"; do
    unit="$UNITDIR/fabricmon-$r.service"
    rc=0
    err=$(systemd-analyze verify "$unit" 2>&1 >/dev/null) || rc=$?
    bad=$(printf '%s\n' "$err" | grep -e "fabricmon-$r" -e Unknown -e Invalid -e Failed -e "not executable" || true)
    [ "$rc" -eq 0 ] && [ -z "$bad" ] \
      || die "$unit does not pass systemd-analyze verify (exit $rc): ${bad:-$err} (scripts/install.sh --uninstall removes this install)"
  done
else
  note "systemd-analyze not installed: the units were not verified"
fi
! systemd_running || systemctl daemon-reload

note "installed $("$PREFIX/bin/fabricmon" --version) in $PREFIX"
note "configs in $CONF (edit them, then: $PREFIX/bin/fabricmon check-config FILE)"
for r in "${ROLES[@]}"; do note "start: systemctl enable --now fabricmon-$r"; done
# Jobs that report nothing are named from the scheduler: slurmd's Prolog=/Epilog= run these (no arguments)
if [ "$ROLE" != aggregator ]; then
  for h in prolog epilog; do [ -x "$PREFIX/bin/fabricmon-slurm-$h" ] || die "$PREFIX/bin/fabricmon-slurm-$h missing"; done
  note "Slurm (slurm.conf): Prolog=$PREFIX/bin/fabricmon-slurm-prolog Epilog=$PREFIX/bin/fabricmon-slurm-epilog"
fi
