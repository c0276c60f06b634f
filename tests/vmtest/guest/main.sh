#!/bin/sh
# Guest side of run.sh: runs under the initramfs's busybox sh, as root, with
# the host's / read-only at /mnt/host. $1 is the host path of the run's
# job.env (modes, binary). Sets up each mode (guest/<mode>.sh, sourced so it
# can export variables for the test), then runs job.sh in a chroot into the
# host's /. Exit status: the test's (init prints it as VMTEST-RESULT).
H=/mnt/host
[ -f "$H$1" ] || { echo "VMTEST: no job file $H$1"; exit 1; }
. "$H$1"
up() { cut -d' ' -f1 /proc/uptime; }
since() { echo "$(up) $1" | awk '{printf "%.1f", $1-$2}'; }
# (Sourced scripts share our variables: they use their own names.)
for vmtest_mode in $(echo "$VMTEST_MODES" | tr '+' ' '); do
  vmtest_t=$(up)
  . "$H$VMTEST_KIT/guest/$vmtest_mode.sh"
  echo "VMTEST: $vmtest_mode setup took $(since "$vmtest_t")s"
done
echo "VMTEST: running $VMTEST_BIN"
t=$(up)
chroot "$H" /bin/sh "$VMTEST_RUN/job.sh"
rc=$?
echo "VMTEST: test exit status $rc after $(since "$t")s"
exit $rc
