import sys

total = 0
for arg in sys.argv[2:]:
    total += int(arg)
print(total)
