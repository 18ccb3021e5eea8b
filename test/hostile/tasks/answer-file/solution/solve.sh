#!/bin/sh
echo 'a piano' > /app/answer.txt
