#!/bin/sh
echo done > /srv/work/out.txt
