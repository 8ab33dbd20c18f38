#!/bin/sh
# Run "$@" (the tests' private dockerd) in a mount namespace of its own whose /dev is the
# host's plus stand-in GPU device nodes /dev/nvidia0..7 (character devices of the null,
# zero, full, random and urandom drivers), without creating anything in the host's /dev.
# Under userns-remap runc bind-mounts a container's device nodes from the path they have
# in the container, so a stand-in must exist at that very path for dockerd.
# The namespace is a slave of the host's: mounts made later below a shared mount of the
# host (the tests' node_tmp_root) appear here too, as they would for a node's dockerd; the
# /dev mounts made here stay here.
#   usage: unshare --mount --propagation slave private_dev.sh EMPTY_DIR COMMAND...
# (EMPTY_DIR: where the host's /dev is seen from inside; the caller removes it)
set -eu
old=$1
shift
mount --rbind /dev "$old"
mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
for entry in "$old"/* "$old"/.[!.]*; do
  [ -e "$entry" ] || [ -L "$entry" ] || continue
  name=${entry##*/}
  if [ -L "$entry" ]; then cp -a "$entry" "/dev/$name"
  elif [ -d "$entry" ]; then mkdir "/dev/$name"; mount --rbind "$entry" "/dev/$name"
  else touch "/dev/$name"; mount --bind "$entry" "/dev/$name"; fi
done
i=0
for minor in 3 5 7 8 9 3 5 7; do
  mknod -m 0666 "/dev/nvidia$i" c 1 "$minor"
  i=$((i + 1))
done
exec "$@"
