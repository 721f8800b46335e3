module clmcache.example/clm

go 1.19
