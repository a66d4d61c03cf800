# Paired A/B of the loop-back with two ubdirect builds (e.g. before/after a driver change),
# run in the test-bed guest. Usage (host), with the two release binaries in DIR:
#   cp OLD DIR/ubdirect-before; cp target/release/ubdirect DIR/ubdirect-after; cp this DIR/
#   scripts/vm/run.sh --devices "ivshmem nic0 nic1" --bin DIR/ubdirect-before \
#       --bin DIR/ubdirect-after --files DIR -- 'sh health-ab.sh'
# Prints one "AB rep=R bin=before|after fs=S fps=F" line per run (hugepage buffers, 3 s each).
A=${UBD_NICS%,*}; B=${UBD_NICS#*,}; bind-vfio "$A" "$B" || exit 1
for rep in 1 2 3; do
  for v in before after; do
    for fs in 60 1514; do
      r=$(ubdirect-$v loopback --tx "$A" --rx "$B" --frame-size $fs --batch 32 --seconds 3 --json | tr -d ' \n')
      fps=$(echo "$r" | sed -n 's/.*"frames_per_s":\([0-9.]*\).*/\1/p')
      echo "AB rep=$rep bin=$v fs=$fs fps=$fps"
    done
  done
done
