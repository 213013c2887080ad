BUG:|WARNING:|Oops|general protection fault|KASAN|UBSAN|kmemleak: [0-9]+ new suspected|Kernel panic|Call Trace:|blocked for more than [0-9]+ seconds|soft lockup|hard LOCKUP
