# Count one TAP stream (a guest shell test's output). Prints "passed failed skipped".
# -v rc=<exit status of the script>. Rules: "ok" lines pass ("# SKIP" ones are skipped),
# "not ok" lines fail ("# TODO" ones are skipped), "Bail out!" fails, tests a "1..N" plan
# promised but never reported fail, a "1..0" plan (the whole file skipped, "1..0 # SKIP why")
# counts one skipped, a non-zero exit without any failure counts one failure, and so does a
# script that printed no TAP at all (no result, no plan: it tested nothing).
/^ok([ \t]|$)/ { if ($0 ~ /# *[Ss][Kk][Ii][Pp]/) s++; else p++; n++ }
/^not ok([ \t]|$)/ { if ($0 ~ /# *[Tt][Oo][Dd][Oo]/) s++; else f++; n++ }
/^Bail out!/ { f++ }
/^1\.\.[0-9]+/ { split($0, a, "[.][.]"); plan = a[2] + 0; hasplan = 1; if (plan == 0) skipall = 1 }
END {
    if (plan > n) f += plan - n
    if (skipall && n == 0) s++
    if (rc != 0 && f == 0) f++
    if (n == 0 && !hasplan && f == 0) f++
    printf "%d %d %d\n", p, f, s
}
