#!/usr/bin/env bash
# README's commands on a fresh, minimal Debian 12: a debootstrap "minbase" bookworm (no
# compiler, no CMake, no git, no sudo) in a chroot, this checkout's HEAD cloned into root's home
# (/root, mode 0700, as a root user's checkout is), and the command run there as root. Not
# part of CI: it needs root, Debian's archive on the network and about 45 minutes on 2 cores
# (every package installed, every object compiled with an empty ccache).
#
#   tests/deploy/fresh_debian.sh [test|run] [DIR] [--user]   (default: test, /tmp/kvarn-fresh)
#
# test runs deploy/test.sh (what CI runs), run runs deploy/run.sh. --user runs it as a user
# "dev" with sudo (the checkout in /home/dev), as a developer would; the tests that need root
# then skip. DIR is created when missing
# and kept afterwards (a second call reuses its packages and ccache; delete it for a fresh
# start). The host's local CA certificates (/usr/local/share/ca-certificates) are copied in,
# for networks whose proxy re-signs TLS (npm's registry is reached over TLS).
set -euo pipefail
as_user=0
args=()
for a in "$@"; do
  if [ "$a" = --user ]; then as_user=1; else args+=("$a"); fi
done
what=${args[0]:-test}
root=${args[1]:-/tmp/kvarn-fresh}
case "$what" in test | run) ;; *) echo "usage: $0 [test|run] [DIR] [--user]" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "fresh_debian: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
if [ ! -x "$root/bin/bash" ]; then
  echo "fresh_debian: debootstrap --variant=minbase bookworm $root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
fi
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2>/dev/null || umount -lR "${mounted[i]}" ||
      echo "fresh_debian: ${mounted[i]} is still mounted: unmount it before deleting $root" >&2
  done
}
trap cleanup EXIT
mount_once() {  # type-or-bind source target
  mountpoint -q "$3" && return
  if [ "$1" = bind ]; then
    mount --rbind "$2" "$3"
    mount --make-rslave "$3"  # unmounting it later must not unmount the host's
  else
    mount -t "$1" "$2" "$3"
  fi
  mounted+=("$3")
}
mount_once proc proc "$root/proc"
mount_once bind /sys "$root/sys"
mount_once bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" sh -c 'command -v update-ca-certificates >/dev/null && update-ca-certificates >/dev/null || true'
fi
env=(TERM=dumb NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt)
if [ "$as_user" = 1 ]; then
  chroot "$root" /bin/bash -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo > /dev/null &&
    { id dev > /dev/null 2>&1 || useradd -m -s /bin/bash dev; } &&
    echo "dev ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/dev'
  home=/home/dev
else
  chmod 0700 "$root/root"
  home=/root
fi
rm -rf "$root$home/kvarnd"
git clone -q "$repo" "$root$home/kvarnd"
echo "fresh_debian: $(git -C "$root$home/kvarnd" log --oneline -1 | cut -c1-100)"
start=$(date +%s)
set +e
if [ "$as_user" = 1 ]; then
  chroot "$root" chown -R dev:dev "$home/kvarnd"
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin /usr/bin/sudo -u dev -H /usr/bin/env \
    PATH=/usr/local/bin:/usr/bin:/bin "${env[@]}" /bin/bash -c "cd ~/kvarnd && deploy/$what.sh"
else
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "${env[@]}" /bin/bash -c "cd /root/kvarnd && deploy/$what.sh"
fi
rc=$?
set -e
echo "fresh_debian: deploy/$what.sh exited $rc after $(( $(date +%s) - start )) s"
exit $rc
