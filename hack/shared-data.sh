#!/usr/bin/env bash
# Sourced by the scripts that use the machine's data beside the repository
# (hack/test-vm.sh, hack/test-vm-node.sh).

# shared_data REPO FILE: the path of ../shared/data/FILE beside the repository
# REPO; for a clone of a local checkout (its origin a directory), beside that
# checkout when not beside the clone. Prints nothing when neither has it.
shared_data() {
  local repo=$1 file=$2 origin
  if [ -f "$repo/../shared/data/$file" ]; then
    echo "$repo/../shared/data/$file"
    return
  fi
  origin=$(git -C "$repo" config --get remote.origin.url 2>/dev/null) || return 0
  [ -d "$origin" ] && [ -f "$origin/../shared/data/$file" ] && echo "$origin/../shared/data/$file"
  return 0
}
