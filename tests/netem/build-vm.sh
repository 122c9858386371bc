#!/usr/bin/env bash
# Prepare, once per kernel version, what the netem VM boots: Debian's stock kernel (which has
# sch_netem as a module) and a base initramfs with busybox, dash, this host's tc, ip and iperf3 with the
# libraries they link, and the kernel modules the cases need.
#
#   build-vm.sh CACHE_DIR   ->  prints KERNEL=<vmlinuz>, BASE_INITRD=<cpio.gz>, MODULES=<names> on stdout
#
# CACHE_DIR/<kernel version>/ keeps vmlinuz, the modules (decompressed: busybox insmod may not read
# xz) and base-<hash>.cpio.gz, the hash taken over this script and the host binaries copied in, so
# an upgraded tc or iperf3 builds a new one. Idempotent; a second run with everything cached takes
# a fraction of a second. What changes per run (the guest's scripts and the generated tc commands)
# is not in here: netem_vm.py appends it as a second cpio archive, which the kernel unpacks on top.
set -euo pipefail

cache=${1:?usage: build-vm.sh CACHE_DIR}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
log() { printf '[netem-vm] %s\n' "$*" >&2; }
die() { printf '[netem-vm] error: %s\n' "$*" >&2; exit 1; }

# Loaded at boot (the lab's host always has them); sch_netem is kept apart and loaded by the guest
# only after the first probe, so that the VM is first a kernel without netem, then one with it.
BOOT_MODULES="veth ifb sch_tbf sch_htb sch_ingress cls_u32 act_mirred"
LATE_MODULES="sch_netem"

for tool in apt-cache apt-get dpkg-deb cpio gzip busybox dash tc ip iperf3 ldd; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: run 'make netem-vm' (tests/netem/ensure-vm-tools.sh installs it)"
done

# The package Debian's linux-image-amd64 depends on today, e.g. linux-image-6.1.0-56-amd64.
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'
}
package=$(kernel_package || true)
if [ -z "$package" ]; then
  cached=$(find "$cache" -mindepth 2 -maxdepth 2 -name vmlinuz 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$cached" ]; then
    package=linux-image-$(basename "$(dirname "$cached")")
    log "apt knows no linux-image-amd64 now; using the cached $package"
  elif [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    package=$(kernel_package || true)
  fi
fi
[ -n "$package" ] || die "apt-cache finds no linux-image-amd64 (run 'apt-get update' as root, on Debian)"
version=${package#linux-image-}
kdir=$cache/$version

# --------------------------------------------------------------------------------- the kernel
module_file() {  # the module's file in an extracted package, any compression
  find "$1/lib/modules/$version" \( -name "$2.ko" -o -name "$2.ko.xz" -o -name "$2.ko.zst" -o -name "$2.ko.gz" \) \
    -print -quit
}

# Unpacked again when a module this script now asks for is not among those unpacked before.
missing_module() {
  local name
  for name in $BOOT_MODULES $LATE_MODULES; do
    grep -q " $name " "$kdir/modules/.complete" 2>/dev/null || return 0
  done
  return 1
}

if [ ! -s "$kdir/vmlinuz" ] || [ ! -s "$kdir/modules/.complete" ] || missing_module; then
  rm -f "$kdir/modules/.depends"
  work=$(mktemp -d "$cache/.download.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "downloading $package (about 70 MB, once per kernel version)"
  if ! (cd "$work" && apt-get download -q "$package" >/dev/null 2>&1); then
    # Stale package lists: the mirror may have moved on to a newer kernel, with another name.
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq >/dev/null 2>&1 || true
      package=$(kernel_package || true)
      [ -n "$package" ] || die "apt-cache finds no linux-image-amd64 after apt-get update"
      version=${package#linux-image-}
      kdir=$cache/$version
    fi
    (cd "$work" && apt-get download -q "$package" >/dev/null) || die "apt-get download $package failed"
  fi
  # Only the kernel and the network modules (a few MB): the whole package unpacks to about 400 MB,
  # more than a nearly full disk has, and nothing else in it is used. Every module the cases load,
  # and each one's dependencies, lives under kernel/net or kernel/drivers/net.
  dpkg-deb --fsys-tarfile "$work"/"$package"_*.deb \
    | (mkdir -p "$work/root" && cd "$work/root" && tar -x --wildcards "./boot/vmlinuz-$version" \
         "./lib/modules/$version/kernel/net/*" "./lib/modules/$version/kernel/drivers/net/*") \
    || die "could not unpack the kernel and its network modules from $package (is the disk full? df -h $cache)"
  mkdir -p "$kdir/modules"
  # Each module with what it depends on (modinfo's depends=, read from the .ko itself).
  queue="$BOOT_MODULES $LATE_MODULES"
  done_list=" "
  while [ -n "${queue// /}" ]; do
    name=${queue%% *}; queue=${queue#"$name"}; queue=${queue# }
    [ -n "$name" ] || continue
    case "$done_list" in *" $name "*) continue ;; esac
    src=$(module_file "$work/root" "$name")
    [ -n "$src" ] || die "$package has no module $name"
    case "$src" in
      *.xz) xz -dc "$src" > "$kdir/modules/$name.ko" ;;
      *.zst) zstd -qdc "$src" > "$kdir/modules/$name.ko" ;;
      *.gz) gzip -dc "$src" > "$kdir/modules/$name.ko" ;;
      *) cp "$src" "$kdir/modules/$name.ko" ;;
    esac
    deps=$(tr '\0' '\n' < "$kdir/modules/$name.ko" | sed -n 's/^depends=//p' | tr ',' ' ')
    [ -z "$deps" ] || { queue="$deps $queue"; echo "$name: $deps" >> "$kdir/modules/.depends"; }
    done_list="$done_list$name "
  done
  cp "$work"/root/boot/vmlinuz-"$version" "$kdir/vmlinuz.tmp" && mv "$kdir/vmlinuz.tmp" "$kdir/vmlinuz"
  echo "$done_list" > "$kdir/modules/.complete"
  rm -rf "$work"
  trap - EXIT
fi

# Boot order: dependencies first (.depends lists "module: its deps"); the late ones stay out.
boot_order() {
  local name seen=" "
  visit() {
    local dep
    case "$seen" in *" $1 "*) return ;; esac
    # shellcheck disable=SC2013 # the line is a list of words
    for dep in $(sed -n "s/^$1: //p" "$kdir/modules/.depends" 2>/dev/null); do visit "$dep"; done
    seen="$seen$1 "
    printf '%s ' "$1"
  }
  for name in $BOOT_MODULES; do visit "$name"; done
}

# ------------------------------------------------------------------------- the base initramfs
binaries=("$(command -v busybox)" "$(command -v dash)" "$(command -v tc)" "$(command -v ip)" "$(command -v iperf3)")
libraries() {  # every library the dynamic binaries load, the loader included
  ldd "${binaries[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && NF > 1 {print $1}' | sort -u
}
# shellcheck disable=SC2046 # one word per file
key=$( { cat "$0"; ls -lL "${binaries[@]}" $(libraries); } | sha256sum | cut -c1-16)
base=$kdir/base-$key.cpio.gz
if [ ! -s "$base" ]; then
  log "building the base initramfs for $version"
  stage=$(mktemp -d "$cache/.stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,var,etc,modules,late-modules}
  ln -s ../run "$stage/var/run"
  cp "$(command -v busybox)" "$stage/bin/busybox"
  # sh is dash, as in a lab's Debian node: Debian's busybox shell runs its own ip and tc applets
  # ahead of any on PATH, so labctl's scripts would not meet iproute2 under it.
  cp -L "$(command -v dash)" "$stage/bin/dash"
  ln -s dash "$stage/bin/sh"
  for binary in tc ip iperf3; do cp -L "$(command -v "$binary")" "$stage/usr/sbin/$binary"; done
  for lib in $(libraries); do cp -L --parents "$lib" "$stage"; done
  for name in $(boot_order); do cp "$kdir/modules/$name.ko" "$stage/modules/"; done
  for name in $LATE_MODULES; do cp "$kdir/modules/$name.ko" "$stage/late-modules/"; done
  boot_order > "$stage/modules/order"
  echo "root:x:0:0:root:/:/bin/sh" > "$stage/etc/passwd"
  (cd "$stage" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) > "$base.tmp"
  mv "$base.tmp" "$base"
  rm -rf "$stage"
  trap - EXIT
  # Older bases of this kernel were built from other binaries: keep only this one.
  find "$kdir" -maxdepth 1 -name 'base-*.cpio.gz' ! -name "base-$key.cpio.gz" -delete
fi

echo "KERNEL=$kdir/vmlinuz"
echo "BASE_INITRD=$base"
echo "VERSION=$version"
echo "BOOT_MODULES=$(boot_order)"
echo "LATE_MODULES=$LATE_MODULES"
