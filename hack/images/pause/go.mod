module ttdrv.local/pause

go 1.22
